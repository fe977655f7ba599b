"""Build the Cython kernel: the .pyx sources are cythonized at build time."""

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
    Extension(f"segack.pyx.{name}", [f"src/segack/pyx/{name}.pyx"], extra_compile_args=["-O3"])
    for name in ("segments", "hashes", "acker", "partitioner")
]

setup(ext_modules=cythonize(extensions, compiler_directives=COMPILER_DIRECTIVES))
