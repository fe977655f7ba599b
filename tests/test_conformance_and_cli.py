"""Conformance vectors (ours and Axon's sample) and the ``segack locate`` command."""

from __future__ import annotations

from pathlib import Path

import pytest

from segack import cli, conformance
from tests.test_hashes import java_string_hash_by_definition

HERE = Path(__file__).parent
OUR_VECTORS = HERE / "vectors" / "segack-spec.jsonl"
AXON_SAMPLE = HERE / "vectors" / "axon-sample.jsonl"


def test_checked_in_vectors_are_what_the_spec_generates():
    lines = [vector for _, vector in conformance.read_vectors(OUR_VECTORS)]
    assert lines == conformance.generate()


def test_the_axon_sample_says_where_it_comes_from():
    assert AXON_SAMPLE.read_text().startswith("# Generated from Axon Framework's Segment")


@pytest.mark.parametrize("name", ["kernel", "spec"])
def test_our_vectors_pass(name):
    count, failures = conformance.check_file(OUR_VECTORS, conformance.IMPLEMENTATIONS[name])
    assert count > 300 and failures == []


@pytest.mark.parametrize("name", ["kernel", "spec"])
def test_axon_sample_passes(name):
    count, failures = conformance.check_file(AXON_SAMPLE, conformance.IMPLEMENTATIONS[name])
    assert count == 175 and failures == []


def test_a_missing_vector_file_fails(tmp_path, capsys):
    assert conformance.main([str(OUR_VECTORS), str(tmp_path / "gone.jsonl")]) == 1
    assert "gone.jsonl: no such vector file" in capsys.readouterr().err


def test_a_wrong_vector_is_reported(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op":"split","in":[0,0],"out":[[0,1],[2,1]]}\n')
    count, failures = conformance.check_file(bad, conformance.IMPLEMENTATIONS["kernel"])
    assert count == 1 and len(failures) == 1 and "bad.jsonl:1" in failures[0]
    assert conformance.main([str(bad)]) == 1


def test_locate_prints_the_owner_of_each_key(capsys):
    assert cli.main(["locate", "user-1", "user-2", "--segments", "4", "--hash", "java"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for key, line in zip(["user-1", "user-2"], lines, strict=True):
        expected = java_string_hash_by_definition(key)
        assert f"hash {expected:>11}" in line
        assert f"(id {expected & 3}, mask 3" in line


def test_locate_accepts_live_ids(capsys):
    assert cli.main(["locate", "k", "--segments", "0,1,3", "--hash", "spark"]) == 0
    assert "segment #" in capsys.readouterr().out


@pytest.mark.parametrize("segments", ["0,2", "0", "x", "1,3", "0,1,1"])
def test_locate_rejects_bad_segments(capsys, segments):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["locate", "k", "--segments", segments])
    assert exit_info.value.code == 2
    assert "bad --segments" in capsys.readouterr().err
