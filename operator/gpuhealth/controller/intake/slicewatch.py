"""A slim list-then-watch of DRA ResourceSlices: which device each GPU is, without asking per fault.

ResourceSlices carry every attribute and capacity a driver publishes (a few KB per node); the
operator needs the driver, pool, shared counter sets and each device's name, UUID, parent UUID, type,
profile, index and consumed counter sets, so each slice is slimmed
(``actions.slices.slim_slice``) as soon as it is read and kept in a :class:`SliceCache`, which
readers query from any thread. The protocol (list, watch with bookmarks, resume, list again and
replace the cache on 410 Gone, growing retry delays) is ``reflector.py``'s.

On a cluster without DRA (no resource.k8s.io/v1, or no slices) the cache stays empty and every
GPU falls back to node scope.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuhealth.actions.gpudevices import GpuDevices, device_by_uuid, devices_of_gpu, is_partition
from gpuhealth.actions.slices import SlimSlice, slim_slice
from gpuhealth.controller.intake.reflector import WATCH_TIMEOUT_S, Reflector
from gpuhealth.kube.errors import status_of

log = logging.getLogger(__name__)


class SliceSource(Protocol):
    def list_resource_slices_rv(self, transform: Callable[[dict[str, Any]], Any]) -> tuple[list[Any], str]: ...

    def watch_resource_slices(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...


Pool = tuple[str, str]  # (driver, pool)


class SliceCache:
    """Slim ResourceSlices by name; safe to read from any thread while the watch updates it.

    Indexed by pool, by the node a slice names (its pool or ``nodeName``) and by the UUIDs of the
    full GPUs it publishes, so that one node's lookup reads that node's pools (and the pools of any other
    node publishing one of its GPUs' UUIDs, for the contradiction checks), never the whole fleet's
    slices: a MIG fleet of 1,000 nodes publishes 56,000 devices, and walking them all for each GPU
    of each pass made a pass cost grow with the fleet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices: dict[str, SlimSlice] = {}
        self._pools: dict[Pool, set[str]] = {}  # pool -> names of its slices
        self._of_node: dict[str, set[Pool]] = {}  # a node (pool name or nodeName) -> its pools
        # A full GPU's UUID -> the pools publishing it as a GPU (what the contradiction checks look for
        # in other pools); MIG devices and placements are found in their own node's pools, so their
        # UUIDs (56 on a node of 7-way MIG GPUs) are not indexed.
        self._of_uuid: dict[str, set[Pool]] = {}
        self.synced = threading.Event()  # set after the first full list

    @staticmethod
    def _keys(s: SlimSlice) -> tuple[Pool, set[str], set[str]]:
        gpus = {d.uuid for d in s.devices if d.uuid and not is_partition(d)}
        return (s.driver, s.pool), {k for k in (s.pool, s.node) if k}, gpus

    def _add(self, s: SlimSlice) -> None:
        pool, nodes, uuids = self._keys(s)
        self._slices[s.name] = s
        self._pools.setdefault(pool, set()).add(s.name)
        for n in nodes:
            self._of_node.setdefault(n, set()).add(pool)
        for u in uuids:
            self._of_uuid.setdefault(u, set()).add(pool)

    def _drop(self, name: str) -> None:
        s = self._slices.pop(name, None)
        if s is None:
            return
        pool, nodes, uuids = self._keys(s)
        left = self._pools.get(pool, set())
        left.discard(name)
        if not left:
            self._pools.pop(pool, None)
        for other in left:  # what the pool's other slices still publish keeps the pool under that key
            _, still_nodes, still_uuids = self._keys(self._slices[other])
            nodes -= still_nodes
            uuids -= still_uuids
        for index, keys in ((self._of_node, nodes), (self._of_uuid, uuids)):
            for k in keys:
                pools = index.get(k)
                if pools is not None:
                    pools.discard(pool)
                    if not pools:
                        del index[k]

    def replace(self, slices: Iterable[SlimSlice]) -> None:
        with self._lock:
            self._slices, self._pools, self._of_node, self._of_uuid = {}, {}, {}, {}
            for s in slices:
                self._add(s)
        self.synced.set()

    def apply(self, kind: str, s: SlimSlice) -> None:
        with self._lock:
            self._drop(s.name)
            if kind != "DELETED":
                self._add(s)

    def slices(self) -> list[SlimSlice]:
        with self._lock:
            return list(self._slices.values())

    def for_node(self, node: str, uuids: Iterable[str] = ()) -> list[SlimSlice]:
        """Every slice of the pools that publish ``node``'s devices or any of ``uuids``: all that the
        mapping of ``node``'s GPUs reads (``actions/gpudevices.py`` filters by node and generation
        within whole pools, so whole pools give it the same answer as the full list)."""
        with self._lock:
            pools = set(self._of_node.get(node, ()))
            for u in uuids:
                if u:
                    pools |= self._of_uuid.get(u, set())
            return [self._slices[n] for p in sorted(pools) for n in sorted(self._pools.get(p, ()))]

    def find(
        self, node: str, drivers: Sequence[str], index: int | None, uuid: str, reported: Collection[str] = ()
    ) -> GpuDevices:
        """The DRA devices of GPU ``index`` / ``uuid`` on ``node`` (``actions.gpudevices.devices_of_gpu``).
        Without a UUID (a driver that publishes only an index) every slice is read: the GPU's UUID,
        which the contradiction checks look for elsewhere, is only known once its device is found."""
        slices = self.for_node(node, (uuid,)) if uuid else self.slices()
        return devices_of_gpu(slices, node, drivers, index, uuid, reported)

    def by_uuid(self, node: str, drivers: Sequence[str], uuid: str) -> GpuDevices:
        """The one DRA device of ``node`` publishing ``uuid`` (``actions.gpudevices.device_by_uuid``)."""
        return device_by_uuid(self.for_node(node), node, drivers, uuid)


Items = list[SlimSlice]  # (a name of its own: `list` is a method of the watch below)


@dataclass
class SliceWatch(Reflector[SlimSlice]):
    """Keeps ``cache`` current from a thread; ``on_change(pool)`` (optional) hears which pool changed."""

    source: SliceSource
    cache: SliceCache = field(default_factory=SliceCache)
    on_change: Callable[[str], None] | None = None
    resource_version: str = ""
    stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    NAME = "slice-watch"
    WATCH = "slices"
    # 404 (an API server without resource.k8s.io/v1) is retried too, slowly.
    RETRY_BASE_S, RETRY_MAX_S = 0.5, 30.0

    def list(self) -> None:
        """A fresh full list into the cache; the watch continues from its resourceVersion."""
        self._replaced(self.full_list())

    def _notify(self, pool: str) -> None:
        if self.on_change is not None:
            try:
                self.on_change(pool)
            except Exception:
                log.exception("slice watch: on_change failed")

    def _list(self) -> Items:
        try:
            slices, self.resource_version = self.source.list_resource_slices_rv(slim_slice)
        except Exception as e:
            if status_of(e) == 404:
                # No resource.k8s.io/v1 here: listed, and empty (every GPU is node scope at once,
                # nothing waits for slices that cannot come); the watch keeps asking, slowly.
                self.cache.replace([])
            raise
        return list(slices)

    def _watch(self) -> Iterable[Mapping[str, Any]]:
        return self.source.watch_resource_slices(self.resource_version, WATCH_TIMEOUT_S)

    def _slim(self, obj: Mapping[str, Any]) -> SlimSlice:
        return slim_slice(obj)

    def _replaced(self, items: Items) -> None:
        self.cache.replace(items)
        self._notify("")

    def _event(self, kind: str, item: SlimSlice) -> None:
        self.cache.apply(kind, item)
        self._notify(item.pool)
