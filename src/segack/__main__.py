"""``python -m segack``: the same as the ``segack`` command."""

import sys

from segack.cli import main

sys.exit(main())
