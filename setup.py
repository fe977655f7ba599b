"""Build the Cython kernel: the .pyx sources are cythonized at build time."""

import glob
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

# The one definition of the kernel's compiler directives; a .pyx header only adds what is
# particular to its module.
COMPILER_DIRECTIVES = {
    "language_level": 3,
    "embedsignature": True,
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
}

extensions = [
    Extension(f"segack.pyx.{name}", [f"src/segack/pyx/{name}.pyx"], extra_compile_args=["-O3"],
              # The .pxi parts a module includes: a change to one rebuilds it.
              depends=sorted(glob.glob(f"src/segack/pyx/{name}_*.pxi")))
    for name in ("segments", "hashes", "acker", "partitioner")
]

# Cythonized and compiled a module per core: the build is most of a fresh install's time.
CORES = os.cpu_count() or 1
setup(ext_modules=cythonize(extensions, compiler_directives=COMPILER_DIRECTIVES, nthreads=CORES),
      options={"build_ext": {"parallel": CORES}})
