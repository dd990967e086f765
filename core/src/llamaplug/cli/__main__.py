"""`python -m llamaplug.cli`: the `llamaplug` command."""

import sys

from . import main

sys.exit(main())
