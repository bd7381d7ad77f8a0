"""A fake sysfs tree of InfiniBand / RoCE ports for the agent's NIC source (``agent/nic_source.py``),
and of the fake NVML's GPUs as PCI functions for NVIDIA's GPU Feature Discovery (devkit/nvidia_plugins.py).

Lays out what the kernel shows under ``/sys`` (the agent's ``--sysfs-root`` points at the tree's root):
``class/infiniband/<dev>/ports/<p>/{state,phys_state,link_layer,counters/*,hw_counters/*}``,
``class/infiniband/<dev>/device/{numa_node,net/<if>}``, ``class/net/<if>/operstate`` and, for GPUs,
``bus/pci/devices/<bus id>/numa_node`` (and, with :func:`write_gpu_pci`, the files go-nvlib's nvpci
reads). Files are replaced atomically, so an agent reading while a test
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
    _write(Path(root, "bus", "pci", "devices", _sysfs_address(bus_id), "numa_node"), str(numa_node))


def _sysfs_address(bus_id: str) -> str:
    """NVML's bus id (``00000000:18:00.0``) as sysfs names the function (``0000:18:00.0``)."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{domain[-4:]}:{rest}"


def write_gpu_pci(root: str | os.PathLike[str], bus_id: str, *, device_id: int, numa_node: int) -> Path:
    """An NVIDIA GPU as a PCI function (a 3D controller, vendor 0x10de) where sysfs keeps it: ``vendor``,
    ``device``, ``class``, ``numa_node``, ``resource`` (BAR0) and the first 256 bytes of ``config``
    (no capability list: not a vGPU), the files GFD's PCI reader (go-nvlib nvpci) opens. No ``driver``,
    ``iommu_group`` or ``physfn`` link: it reads those as absent."""
    d = Path(root, "bus", "pci", "devices", _sysfs_address(bus_id))
    _write(d / "vendor", "0x10de")
    _write(d / "device", f"0x{device_id:04x}")
    _write(d / "class", "0x030200")
    _write(d / "numa_node", str(numa_node))
    _write(d / "resource", "0x00000000a0000000 0x00000000a0ffffff 0x0000000000040200")
    config = bytearray(256)
    config[0:2] = (0x10DE).to_bytes(2, "little")
    config[2:4] = device_id.to_bytes(2, "little")
    config[8] = 0xA1  # revision
    config[10:12] = (0x0302).to_bytes(2, "little")  # subclass 3D controller, class display
    (d / "config").write_bytes(bytes(config))
    return d
