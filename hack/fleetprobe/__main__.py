import sys

from hack.fleetprobe import main

sys.exit(main())
