"""``python -m kcore``: the command line."""

import sys

from kcore.cli import main

sys.exit(main())
