"""``python -m indexer``: the command line (:mod:`indexer.cli`)."""

import sys

from .cli import main

sys.exit(main())
