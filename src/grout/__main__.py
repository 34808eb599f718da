"""``python -m grout``: the grout command line (see grout.cli)."""
import sys

from .cli import main

sys.exit(main())
