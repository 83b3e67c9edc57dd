"""``python -m gendurable``: the ``gendurable`` command."""

import sys

from .cli import main

sys.exit(main())
