"""The ``segack`` command, a module for each part and for each family of commands.

======================  ============================================================================
``entry``               :func:`main`: parse the command line, log to stderr, run the command's module
``parser``              the commands, their arguments and help (the docs' reference is made from it)
``flags``               each flag's type; the flags commands share; one per run option (``RUN_FLAGS``)
``exit_codes``          :class:`ExitCode`
``output``              counts, percentages, times, a refusal's line, the progress printer
``session``             the Spark session of a command that starts one, and the signals that stop it
``runs``                ``replay`` and ``stream``
``plan``                ``locate`` and ``plan``
``status``              ``status`` and ``dead-letters`` (no Spark)
``control``             ``split``, ``merge``, ``scale`` and ``release`` (no Spark)
``ui``                  ``ui``
``demo``                ``demo``
======================  ============================================================================

Only :mod:`~segack.cli.entry` imports a command's module, when that command runs: ``segack status``
imports nothing that starts Spark.
"""

from segack.cli.entry import main
from segack.cli.exit_codes import ExitCode

__all__ = ["ExitCode", "main"]
