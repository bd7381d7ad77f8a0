"""``python -m hack.memprobe``."""

from hack.memprobe import main

raise SystemExit(main())
