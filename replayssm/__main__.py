"""``python -m replayssm {info,cache,demo}``; see :mod:`replayssm.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
