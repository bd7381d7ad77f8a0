"""A fake sysfs tree of InfiniBand / RoCE ports for the agent's NIC source (``agent/nic_source.py``).

Lays out what the kernel shows under ``/sys`` (the agent's ``--sysfs-root`` points at the tree's root):
``class/infiniband/<dev>/ports/<p>/{state,phys_state,link_layer,counters/*,hw_counters/*}``,
``class/infiniband/<dev>/device/{numa_node,net/<if>}``, ``class/net/<if>/operstate`` and, for GPUs,
``bus/pci/devices/<bus id>/numa_node``. Files are replaced atomically, so an agent reading while a test
rewrites one never sees half a value.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

# sysfs writes the state's number and name.
PORT_STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_STATES = {"Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4, "LinkUp": 5}
PHYS_STATES["LinkErrorRecovery"] = 6


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".sysfs-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def write_port(
    root: str | os.PathLike[str],
    device: str,
    port: int = 1,
    *,
    state: str = "ACTIVE",
    phys_state: str = "LinkUp",
    link_layer: str = "InfiniBand",
    counters: Mapping[str, int] | None = None,
    hw_counters: Mapping[str, int] | None = None,
    numa_node: int | None = None,
    netdev: str | None = None,
    operstate: str | None = None,
) -> Path:
    """Write (or rewrite) one port; counters not given keep their file (0 when new)."""
    base = Path(root, "class", "infiniband", device)
    p = base / "ports" / str(port)
    _write(p / "state", f"{PORT_STATES.get(state, 0)}: {state}")
    _write(p / "phys_state", f"{PHYS_STATES.get(phys_state, 0)}: {phys_state}")
    _write(p / "link_layer", link_layer)
    defaults = {
        "link_downed": 0,
        "local_link_integrity_errors": 0,
        "excessive_buffer_overrun_errors": 0,
        "symbol_error": 0,
        "link_error_recovery": 0,
        "port_rcv_errors": 0,
    }
    for name, value in {**defaults, **(counters or {})}.items():
        if name in (counters or {}) or not (p / "counters" / name).exists():
            _write(p / "counters" / name, str(value))
    for name, value in {"rnr_nak_retry_err": 0, **(hw_counters or {})}.items():
        if name in (hw_counters or {}) or not (p / "hw_counters" / name).exists():
            _write(p / "hw_counters" / name, str(value))
    if numa_node is not None:
        _write(base / "device" / "numa_node", str(numa_node))
    if netdev is not None:
        (base / "device" / "net" / netdev).mkdir(parents=True, exist_ok=True)
        _write(Path(root, "class", "net", netdev, "operstate"), operstate or "up")
    return p


def write_gpu_numa(root: str | os.PathLike[str], bus_id: str, numa_node: int) -> None:
    """The NUMA node of a GPU by NVML's bus id (``00000000:18:00.0``), where sysfs keeps it."""
    domain, _, rest = bus_id.lower().partition(":")
    _write(Path(root, "bus", "pci", "devices", f"{domain[-4:]}:{rest}", "numa_node"), str(numa_node))
