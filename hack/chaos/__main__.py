"""``python -m hack.chaos`` (what `make chaos` and `make soak` run): run.py is the driver and says
what a run does; this only starts it, so importing hack.chaos for one module starts nothing."""

import sys

from hack.chaos.run import main

if __name__ == "__main__":
    sys.exit(main())
