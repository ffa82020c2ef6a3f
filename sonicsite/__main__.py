"""`python -m sonicsite`: the same as the `sonicsite` command."""

import sys

from .cli import main

sys.exit(main())
