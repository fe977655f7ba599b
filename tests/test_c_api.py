"""The shipped ``.pxd`` files are a C API: a Cython module built elsewhere cimports them, and what
it computes through them is what the Python API answers (as pyroaring's ``.pxd`` files are)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import segack

pytestmark = pytest.mark.compiler

CLIENT = """
from libc.stdint cimport int64_t, uint8_t, uint32_t

from segack.pyx.hashes cimport java_hash_long_c, java_hash_utf8_c, spark_hash_long_c
from segack.pyx.segments cimport SegmentSet, segment_matches


def java_hash_text(str text):
    data = text.encode("utf-8", "surrogatepass")
    return java_hash_utf8_c(<const uint8_t *><const char *>data, len(data))


def java_hash_long(int64_t value):
    return java_hash_long_c(value)


def spark_hash_long(int64_t value, uint32_t seed):
    return spark_hash_long_c(value, seed)


def owner_index(SegmentSet segments, uint32_t hash_value):
    return segments.owner_index_c(hash_value)


def matches(uint32_t segment_id, uint32_t mask, uint32_t hash_value):
    return segment_matches(segment_id, mask, hash_value)
"""

SETUP = """
from Cython.Build import cythonize
from setuptools import setup

setup(ext_modules=cythonize("segack_c_client.pyx", include_path=[{root!r}],
                            compiler_directives={{"language_level": 3}}))
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("Cython")
    where = tmp_path_factory.mktemp("c_api")
    (where / "segack_c_client.pyx").write_text(CLIENT)
    # The installed package's directory holds segack/pyx/*.pxd: the include path a user gives.
    (where / "setup.py").write_text(SETUP.format(root=str(Path(segack.__file__).parents[1])))
    built = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=where,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module("segack_c_client")
    finally:
        sys.path.remove(str(where))


@pytest.mark.parametrize("text", ["", "order-1", "À la carte", "日本語", "emoji \U0001f600"])
def test_java_hash_through_the_c_api_is_java_hash(client, text):
    assert client.java_hash_text(text) == segack.java_hash(text)


@pytest.mark.parametrize("value", [0, 1, -1, 2**40 + 5, -(2**63), 2**63 - 1])
def test_long_hashes_through_the_c_api_are_the_python_api(client, value):
    assert client.java_hash_long(value) == segack.java_hash(value)
    assert client.spark_hash_long(value, segack.SPARK_HASH_SEED) == segack.spark_hash(value, "bigint")


def test_segment_lookups_through_the_c_api_are_the_python_api(client):
    segments = segack.SegmentSet.balanced(6)
    for hash_value in range(0, 2**32, 2**32 // 997):
        owner = client.owner_index(segments, hash_value)
        assert owner == segments.owner_index(hash_value)
        member = segments[owner]
        assert client.matches(member.segment_id, member.mask, hash_value)
