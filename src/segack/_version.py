"""The release: the one place it is written (setup reads it from here)."""

__version__ = "0.2.0"
