"""``python -m fastrank``: the same command line as ``fastrank`` (see src/fastrank/cli.py)."""
import sys

from .cli import main

sys.exit(main())
