"""Facts about the host itself that the report needs (boot time)."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from gpuhealth.agent.model import UTC

log = logging.getLogger(__name__)


def read_boot_time(stat_path: str = "/proc/stat", uptime_path: str = "/proc/uptime") -> datetime | None:
    """When the host booted: ``btime`` from /proc/stat, else now minus /proc/uptime.

    XID history is kept per boot: an XID from before a reboot must not follow the node into
    its next life. /proc is the host's even inside a container (boot time is not namespaced).
    """
    try:
        with open(stat_path, encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return datetime.fromtimestamp(int(line.split()[1]), UTC)
    except (OSError, ValueError, IndexError) as exc:
        log.debug("cannot read btime from %s: %s", stat_path, exc)
    try:
        with open(uptime_path, encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return datetime.fromtimestamp(time.time() - uptime, UTC)
    except (OSError, ValueError, IndexError) as exc:
        log.warning("host boot time unknown (%s); XID history will not survive restarts", exc)
        return None
