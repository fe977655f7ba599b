"""Build the Cython kernel: the .pyx sources are cythonized at build time."""

import glob

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

setup(ext_modules=cythonize(extensions, compiler_directives=COMPILER_DIRECTIVES))
