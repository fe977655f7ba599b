"""segack: ordered, resumable, rescalable event processing on Spark.

The public API is the compiled kernel's; :mod:`segack.specs` holds the
pure-Python reference with the same names.
"""

from __future__ import annotations

import logging

from segack._version import __version__
from segack.kernel import *  # noqa: F403
from segack.kernel import __all__ as _kernel_all

__all__ = [*_kernel_all, "__version__"]

# A library logs; the application decides where to (the `segack` command: warnings, and with
# --verbose what runs decide).
logging.getLogger(__name__).addHandler(logging.NullHandler())
