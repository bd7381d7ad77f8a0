import sys

from hack.coldstart import main

sys.exit(main())
