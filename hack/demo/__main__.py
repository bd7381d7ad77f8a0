"""``python -m hack.demo``: see hack/demo/__init__.py."""

import sys

from hack.demo.run import main

sys.exit(main())
