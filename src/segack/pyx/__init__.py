"""Cython sources of the kernel; the ``.pxd`` files ship so other Cython code can cimport them."""
