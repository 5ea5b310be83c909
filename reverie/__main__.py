"""``python -m reverie ...`` runs the same command line as the ``reverie`` console script."""

import sys

from reverie.cli import main

sys.exit(main())
