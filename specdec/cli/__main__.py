"""`python -m specdec.cli ...`: the console script (the server's child processes and the editors start it so)."""

import sys

from specdec.cli import main

sys.exit(main())
