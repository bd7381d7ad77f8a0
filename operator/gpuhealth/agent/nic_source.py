"""NIC health from sysfs: InfiniBand / RoCE ports, the counters that kill NCCL jobs, and their rates.

Read per port under ``<root>/class/infiniband/<dev>/ports/<p>/``: ``state`` ("4: ACTIVE"), ``phys_state``
("5: LinkUp"), ``link_layer``, ``counters/*`` and ``hw_counters/*``; the netdev's ``operstate`` under
``<root>/class/net/<if>/`` (RoCE: EFA's driver hard-codes ``state`` ACTIVE, the netdev tells the truth).
The root is configurable (``--sysfs-root``) so tests use a fake tree.

Which facts (NVIDIA's NIC monitor defaults, judged by the operator, never here; the counters, their
widths and which field each fills are ``api/report_fabric.py`` ``NIC_COUNTERS``): any increase of
``link_downed``, ``local_link_integrity_errors``, ``excessive_buffer_overrun_errors`` and
``rnr_nak_retry_err``; the rates of ``symbol_error``, ``link_error_recovery`` and ``port_rcv_errors``.
The classic port counters are 4 to 16 bits wide and stop at their maximum instead of wrapping: a pinned
counter shows no increase and no rate, which is not the same as none, so it is named as saturated.

Management NICs are excluded: those named in the exclude list, and those on a NUMA node with no GPU
(when both NUMA nodes are known).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuhealth.api.report_fabric import NIC_COUNTERS, NicPort

ENV_SYSFS_ROOT = "GPUHEALTH_SYSFS_ROOT"
ENV_NIC_EXCLUDE = "GPUHEALTH_NIC_EXCLUDE"
RATE_WINDOW_S = 300.0


def saturated_at(bits: int) -> int:
    return (1 << bits) - 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def state_name(text: str | None) -> str | None:
    """``"4: ACTIVE"`` -> ``"ACTIVE"`` (sysfs writes the number and the name)."""
    if not text:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text


def pci_sysfs_name(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` as sysfs names the device: ``0000:18:00.0``."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest}" if rest else bus_id.lower()


@dataclass
class _Counter:
    """One counter of one port: the increase seen since the agent started, and its recent history."""

    bits: int
    last: int | None = None
    increase: int = 0
    history: deque[tuple[float, int]] = field(default_factory=deque)

    def observe(self, value: int, now: float, window_s: float) -> None:
        if self.last is not None:
            # A counter below its last value was reset (port reset, perfquery -R): count from zero.
            self.increase += value - self.last if value >= self.last else value
        self.last = value
        self.history.append((now, self.increase))
        while len(self.history) > 2 and self.history[1][0] <= now - window_s:
            self.history.popleft()

    @property
    def saturated(self) -> bool:
        return self.last is not None and self.bits < 64 and self.last >= saturated_at(self.bits)

    def per_min(self) -> float | None:
        if self.saturated or len(self.history) < 2:
            return None
        (t0, v0), (t1, v1) = self.history[0], self.history[-1]
        return None if t1 <= t0 else (v1 - v0) / (t1 - t0) * 60.0


@dataclass
class NicSource:
    """Reads every InfiniBand / RoCE port under ``root`` each sample; keeps what rates need."""

    root: str = "/sys"
    exclude: tuple[str, ...] = ()
    window_s: float = RATE_WINDOW_S
    monotonic: Callable[[], float] = time.monotonic
    _counters: dict[tuple[str, int, str], _Counter] = field(default_factory=dict)

    def sample(self, gpu_bus_ids: Iterable[str] = ()) -> tuple[NicPort, ...]:
        base = Path(self.root, "class", "infiniband")
        try:
            devices = sorted(os.listdir(base))
        except OSError:
            return ()
        now = self.monotonic()
        gpu_numa = self._gpu_numa_nodes(gpu_bus_ids)
        out: list[NicPort] = []
        for dev in devices:
            if dev in self.exclude or self._management(base / dev, gpu_numa):
                continue
            try:
                ports = sorted(int(p) for p in os.listdir(base / dev / "ports") if p.isdigit())
            except OSError:
                continue
            netdev = self._netdev(base / dev)
            for port in ports:
                out.append(self._port(dev, port, base / dev / "ports" / str(port), netdev, now))
        return tuple(out)

    def _gpu_numa_nodes(self, bus_ids: Iterable[str]) -> set[int]:
        nodes = set()
        for bus_id in bus_ids:
            node = _int(Path(self.root, "bus", "pci", "devices", pci_sysfs_name(bus_id), "numa_node"))
            if node is not None and node >= 0:
                nodes.add(node)
        return nodes

    def _management(self, dev: Path, gpu_numa: set[int]) -> bool:
        """A NIC on a NUMA node with no GPU carries no GPU traffic (both must be known to say so)."""
        if not gpu_numa:
            return False
        node = _int(dev / "device" / "numa_node")
        return node is not None and node >= 0 and node not in gpu_numa

    def _netdev(self, dev: Path) -> str | None:
        try:
            names = sorted(os.listdir(dev / "device" / "net"))
        except OSError:
            return None
        return names[0] if names else None

    def _port(self, dev: str, port: int, path: Path, netdev: str | None, now: float) -> NicPort:
        saturated: list[str] = []

        def counter(name: str, directory: str, bits: int) -> _Counter | None:
            value = _int(path / directory / name)
            if value is None:
                return None
            c = self._counters.setdefault((dev, port, name), _Counter(bits))
            c.observe(value, now, self.window_s)
            if c.saturated:
                saturated.append(name)
            return c

        values: dict[str, int | float | None] = {}
        for n in NIC_COUNTERS:  # api/report_fabric.py: which counter, how wide, increase or rate
            c = counter(n.name, n.directory, n.bits)
            values[n.attr] = None if c is None else c.increase if n.fatal else c.per_min()
        oper = _read(Path(self.root, "class", "net", netdev, "operstate")) if netdev else None
        return NicPort(
            device=dev,
            port=port,
            state=state_name(_read(path / "state")) or "",
            phys_state=state_name(_read(path / "phys_state")) or "",
            link_layer=_read(path / "link_layer") or "",
            netdev=netdev or "",
            oper_state=oper or "",
            **values,  # type: ignore[arg-type]
            saturated=tuple(sorted(saturated)),
        )


def parse_exclude(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"mlx5_0, mlx5_1"`` (flag or env) as a tuple of device names."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(i.strip() for i in items if i.strip())
