"""``python -m hack.bench`` (what `make bench` runs): hack/bench/__init__.py says what a run measures,
run.py drives it. SIGTERM exits 143 through the run's teardown, so a stopped bench still stops the
control plane, the operator and the agents it started."""

import signal
import sys

from hack.bench.run import main

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
