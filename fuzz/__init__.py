"""Fuzz targets (atheris) for everything that parses untrusted bytes; ``nox -s fuzz`` runs them."""
