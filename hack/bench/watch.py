"""The independent watches of `make bench`: Nodes (which taints, since when), GPUNodeHealth (each
node's verdict, and where the no-logic floors hear of their faults) and DeviceTaintRules (which devices
have one, since when).

Raw JSON (no model deserialisation), list then watch, relisting on any error: they observe what the
API server serves, independently of the operator's own watches.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Self

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from hack.bench.support import (
    DEVICE_TAINT_RULES,
    DRA_GROUP,
    DRA_VERSION,
    FLOOR_TAINT,
    GPU_SELECTOR,
    GROUP,
    REPORTS,
    TAINT,
    VERSION,
)

# Carries: whether a report (the object as the watch served it) carries the fault a floor listens for.
Carries = Callable[[dict[str, Any]], bool]
# One XID event of a report: (code, GPU index or None, its time as the agent wrote it).
XidKey = tuple[int, int | None, str]


def xid_keys(obj: dict[str, Any]) -> frozenset[XidKey]:
    """The XID events a GPUNodeHealth object's spec carries, as comparable keys."""
    out = set()
    for e in (obj.get("spec") or {}).get("xidEvents") or []:
        if isinstance(e, dict) and isinstance(e.get("xid"), int):
            gpu = e.get("gpu")
            out.add((int(e["xid"]), gpu if isinstance(gpu, int) else None, str(e.get("time") or "")))
    return frozenset(out)


def first_new_xid(seen: Mapping[XidKey, float], before: frozenset[XidKey], code: int, gpu: int) -> float | None:
    """The earliest sighting of an XID ``code`` on ``gpu`` that is not among ``before``; None if none yet."""
    times = [t for k, t in seen.items() if k not in before and k[0] == code and k[1] == gpu]
    return min(times) if times else None


def _raw_watch(
    list_fn: Callable[..., Any],
    on_sync: Callable[[list[dict[str, Any]]], None],
    on_event: Callable[[str, dict[str, Any]], None],
    stop: threading.Event,
    **kwargs: Any,
) -> None:
    """List then watch, raw JSON (no model deserialisation), relisting on any error."""
    while not stop.is_set():
        try:
            data = json.loads(list_fn(_preload_content=False, **kwargs).data)
            rv = data["metadata"]["resourceVersion"]
            on_sync(data.get("items") or [])
            while not stop.is_set():
                resp = list_fn(
                    watch=True,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=20,
                    _preload_content=False,
                    _request_timeout=(5, 60),
                    **kwargs,
                )
                try:
                    for line in iter_resp_lines(resp):
                        ev = json.loads(line)
                        if ev["type"] == "ERROR":
                            raise RuntimeError(f"watch error: {ev.get('object')}")
                        obj = ev["object"]
                        rv = obj["metadata"]["resourceVersion"]
                        if ev["type"] != "BOOKMARK":
                            on_event(ev["type"], obj)
                        if stop.is_set():
                            return
                finally:
                    resp.release_conn()
        except Exception:
            if stop.is_set():
                return
            time.sleep(0.5)


SYNC_S = 600.0  # how long a watch's first list may take


class _Watch:
    """One of the bench's independent watches: a daemon thread that lists, then watches, and says
    when its first list is in (``start`` waits for it); ``stop`` ends it."""

    def __init__(self, thread_name: str, what: str) -> None:
        self.what = what
        self.synced = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self, timeout_s: float = SYNC_S) -> Self:
        """Start, and wait for the first list. At 10,000 nodes on two shared cores the list of the
        reports alone took over a minute while the control plane caught up (a 10k run at c89c313
        stopped here): a slow list is the machine's state, not a failure, so the wait is generous."""
        self.thread.start()
        if not self.synced.wait(timeout_s):
            raise RuntimeError(f"{self.what} did not sync in {timeout_s:.0f}s")
        return self

    def _run(self) -> None:
        raise NotImplementedError


def last_writer(obj: dict[str, Any]) -> str:
    """Who wrote an object last, as far as the object says: the manager of its newest managedFields
    entry (times have one-second resolution; of entries as new, the last listed). "" where it has none."""
    entries = [e for e in (obj.get("metadata") or {}).get("managedFields") or [] if isinstance(e, dict)]
    if not entries:
        return ""
    newest = max(range(len(entries)), key=lambda i: (str(entries[i].get("time") or ""), i))
    return str(entries[newest].get("manager") or "")


class NodeWatch(_Watch):
    """An independent watch on the GPU Nodes: which taint keys each node carries, and since when; and
    who wrote each Node the watch heard change (``writers_between``), so a phase can say which
    processes changed the Nodes while it ran, and so kept every Node watcher (kwok among them) busy."""

    def __init__(self, api: client.ApiClient, keys: Iterable[str] = (TAINT, FLOOR_TAINT)) -> None:
        super().__init__("bench-node-watch", "node watch")
        self.core = client.CoreV1Api(api)
        self.keys = frozenset(keys)
        self.cond = threading.Condition()
        self.taints: dict[str, frozenset[str]] = {}
        self.seen_at: dict[tuple[str, str], float] = {}
        self.count: dict[str, int] = dict.fromkeys(self.keys, 0)
        self.curve: dict[str, list[tuple[float, int]]] = {k: [] for k in self.keys}
        self.writes: list[tuple[float, str]] = []  # (when heard, last writer) of each MODIFIED event

    def _run(self) -> None:
        _raw_watch(self.core.list_node, self._sync, self._event, self.stop, label_selector=GPU_SELECTOR)

    def _keys_of(self, obj: dict[str, Any]) -> frozenset[str]:
        return frozenset(t.get("key") for t in (obj.get("spec") or {}).get("taints") or []) & self.keys

    def _set(self, name: str, keys: frozenset[str], now: float) -> None:
        old = self.taints.get(name, frozenset())
        if old == keys:
            return
        self.taints[name] = keys
        for k in keys - old:
            self.seen_at[(name, k)] = now
            self.count[k] += 1
            self.curve[k].append((now, self.count[k]))
        for k in old - keys:
            self.seen_at.pop((name, k), None)
            self.count[k] -= 1
            self.curve[k].append((now, self.count[k]))

    def _sync(self, items: list[dict[str, Any]]) -> None:
        now = time.time()
        with self.cond:
            names = set()
            for obj in items:
                name = obj["metadata"]["name"]
                names.add(name)
                self._set(name, self._keys_of(obj), now)
            for name in set(self.taints) - names:
                self._set(name, frozenset(), now)
            self.cond.notify_all()
        self.synced.set()

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        with self.cond:
            name = obj["metadata"]["name"]
            self._set(name, frozenset() if kind == "DELETED" else self._keys_of(obj), now)
            if kind == "MODIFIED":
                self.writes.append((now, sys.intern(last_writer(obj))))
            self.cond.notify_all()

    def writers_between(self, start: float, end: float) -> dict[str, int]:
        """Node changes the watch heard in [start, end), by who made each (``last_writer``), most first."""
        with self.cond:
            heard = Counter(w or "unknown" for t, w in self.writes if start <= t < end)
        return dict(heard.most_common())

    def wait_taint(self, node: str, key: str, timeout: float) -> float | None:
        """When the watch first saw ``key`` on ``node`` (epoch seconds), or None after ``timeout``."""
        with self.cond:
            self.cond.wait_for(lambda: (node, key) in self.seen_at, timeout)
            return self.seen_at.get((node, key))

    def wait_all(self, nodes: Iterable[str], key: str, timeout: float, present: bool = True) -> bool:
        names = list(nodes)
        with self.cond:
            return self.cond.wait_for(lambda: all(((n, key) in self.seen_at) == present for n in names), timeout)

    def tainted(self, key: str = TAINT) -> int:
        with self.cond:
            return self.count[key]


Device = tuple[str, str]  # (pool = node, device name), as the rule watch keys them


def last_rule(seen_at: Mapping[Device, float], devices: Iterable[Device]) -> tuple[float, float] | None:
    """(first, last) sighting of the rules of ``devices``; None while any of them has none."""
    times = [seen_at.get(d) for d in devices]
    if not times or any(t is None for t in times):
        return None
    known = [t for t in times if t is not None]
    return min(known), max(known)


class RuleWatch(_Watch):
    """An independent watch on ``resource.k8s.io/v1`` DeviceTaintRules: since when each device has one.

    A device is ``(pool, device)`` from the rule's ``spec.deviceSelector`` (pool = node name in the
    NVIDIA model), whoever wrote the rule; the bench compares nothing but presence and time.
    """

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__("bench-rule-watch", "DeviceTaintRule watch")
        self.custom = client.CustomObjectsApi(api)
        self.cond = threading.Condition()
        self.rules: dict[str, tuple[str, str]] = {}
        self.seen_at: dict[tuple[str, str], float] = {}

    def _run(self) -> None:
        _raw_watch(
            lambda **kw: self.custom.list_cluster_custom_object(DRA_GROUP, DRA_VERSION, DEVICE_TAINT_RULES, **kw),
            self._sync,
            self._event,
            self.stop,
        )

    @staticmethod
    def _device(obj: dict[str, Any]) -> tuple[str, str]:
        sel = (obj.get("spec") or {}).get("deviceSelector") or {}
        return str(sel.get("pool") or ""), str(sel.get("device") or "")

    def _put(self, name: str, dev: tuple[str, str] | None, now: float) -> None:
        """Record rule ``name`` selecting ``dev`` (None: gone). An update of a rule (the API server and
        the eviction controller write its status) keeps the device's first sighting."""
        old = self.rules.pop(name, None)
        if dev is not None:
            self.rules[name] = dev
            self.seen_at.setdefault(dev, now)
        if old is not None and old != dev and old not in self.rules.values():
            self.seen_at.pop(old, None)

    def _sync(self, items: list[dict[str, Any]]) -> None:
        now = time.time()
        with self.cond:
            names = {o["metadata"]["name"] for o in items}
            for name in set(self.rules) - names:
                self._put(name, None, now)
            for obj in items:
                self._put(obj["metadata"]["name"], self._device(obj), now)
            self.cond.notify_all()
        self.synced.set()

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        with self.cond:
            self._put(obj["metadata"]["name"], None if kind == "DELETED" else self._device(obj), now)
            self.cond.notify_all()

    def wait_rule(self, pool: str, device: str, timeout: float) -> float | None:
        """When the watch first saw a rule for the device (epoch seconds), or None after ``timeout``."""
        with self.cond:
            self.cond.wait_for(lambda: (pool, device) in self.seen_at, timeout)
            return self.seen_at.get((pool, device))

    def wait_all(self, devices: Iterable[tuple[str, str]], timeout: float, present: bool = True) -> bool:
        wanted = list(devices)
        with self.cond:
            return self.cond.wait_for(lambda: all((d in self.seen_at) == present for d in wanted), timeout)

    def count(self) -> int:
        with self.cond:
            return len(self.rules)


class ReportWatch(_Watch):
    """A watch on the GPUNodeHealth objects: each node's verdict (status.state), and the floors' ears.

    The floors hear of their faults here, as a controller would through its watch (``hear``): a floor
    node's report that carries the fault sets the floor's writes going, so every floor pays the same
    watch hop gpuhealth pays before its first write (hack/bench/floors.py).

    For the nodes in ``track_xids`` (the real agents' nodes) it also records when it first saw each XID
    event of their reports (``xid_seen``): the report write that carried it, for the end-to-end split.
    """

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__("bench-report-watch", "report watch")
        self.custom = client.CustomObjectsApi(api)
        self.cond = threading.Condition()
        self.states: dict[str, str] = {}
        self.track_xids: set[str] = set()
        self.xid_seen: dict[str, dict[XidKey, float]] = {}
        # When each node's drain was first seen Completed (status.drain.phase), until a new drain runs.
        self.drain_completed: dict[str, float] = {}
        # The floors' ears: node -> (what the report must carry, what to do once it does), each heard once.
        self.ears_lock = threading.Lock()
        self.ears: dict[str, tuple[Carries, Callable[[], None]]] = {}

    def _run(self) -> None:
        _raw_watch(
            lambda **kw: self.custom.list_cluster_custom_object(GROUP, VERSION, REPORTS, **kw),
            self._sync,
            self._event,
            self.stop,
        )

    def hear(self, node: str, carries: Carries, then: Callable[[], None]) -> None:
        """Once a report of ``node`` that ``carries`` the fault comes through the watch, ``then`` (called
        on the watch's thread: it hands the writes to a worker and returns)."""
        with self.ears_lock:
            self.ears[node] = (carries, then)

    def deaf(self, node: str) -> None:
        """Forget ``node``'s ear (its fault never came)."""
        with self.ears_lock:
            self.ears.pop(node, None)

    def _heard(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        with self.ears_lock:
            ear = self.ears.get(name)
            if ear is None or not ear[0](obj):
                return
            del self.ears[name]
        ear[1]()

    def _xids(self, obj: dict[str, Any], now: float) -> None:
        """Record the first sighting of each XID event a tracked node's report carries (caller holds cond)."""
        name = obj["metadata"]["name"]
        if name in self.track_xids:
            seen = self.xid_seen.setdefault(name, {})
            for key in xid_keys(obj):
                seen.setdefault(key, now)

    def _drain(self, obj: dict[str, Any], now: float) -> None:
        """Record when the node's drain was first seen Completed (caller holds cond)."""
        phase = ((obj.get("status") or {}).get("drain") or {}).get("phase")
        name = obj["metadata"]["name"]
        if phase == "Completed":
            self.drain_completed.setdefault(name, now)
        elif phase in ("Running", "Queued"):
            self.drain_completed.pop(name, None)

    def _sync(self, items: list[dict[str, Any]]) -> None:
        now = time.time()
        if self.ears:  # a relist that brings a fault the broken watch missed: the floor still hears it
            for o in items:
                self._heard(o)
        with self.cond:
            self.states = {o["metadata"]["name"]: str((o.get("status") or {}).get("state") or "") for o in items}
            for o in items:
                self._xids(o, now)
                self._drain(o, now)
            self.cond.notify_all()
        self.synced.set()

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        if self.ears and kind != "DELETED":
            self._heard(obj)
        with self.cond:
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                self.states.pop(name, None)
            else:
                self.states[name] = str((obj.get("status") or {}).get("state") or "")
                self._xids(obj, now)
                self._drain(obj, now)
            self.cond.notify_all()

    def xids_of(self, node: str) -> frozenset[XidKey]:
        """The XID events seen so far in ``node``'s report (to tell the next one from them)."""
        with self.cond:
            return frozenset(self.xid_seen.get(node, {}))

    def wait_new_xid(self, node: str, before: frozenset[XidKey], code: int, gpu: int, timeout: float) -> float | None:
        """When the watch first saw a report of ``node`` carrying an XID ``code`` on ``gpu`` not in ``before``."""
        with self.cond:
            self.cond.wait_for(
                lambda: first_new_xid(self.xid_seen.get(node, {}), before, code, gpu) is not None, timeout
            )
            return first_new_xid(self.xid_seen.get(node, {}), before, code, gpu)

    def wait_states(self, nodes: Iterable[str], state: str, timeout: float) -> float | None:
        """Epoch seconds at which every node in ``nodes`` was seen in ``state``; None on timeout."""
        names = list(nodes)
        with self.cond:
            ok = self.cond.wait_for(lambda: all(self.states.get(n) == state for n in names), timeout)
            return time.time() if ok else None

    def wait_drains(self, nodes: Iterable[str], after: float, timeout: float) -> dict[str, float]:
        """Wait until every node's drain was seen Completed after ``after``; when each was (those that were)."""
        names = list(nodes)

        def done() -> dict[str, float]:
            return {n: t for n in names if (t := self.drain_completed.get(n)) is not None and t >= after}

        with self.cond:
            self.cond.wait_for(lambda: len(done()) == len(names), timeout)
            return done()

    def wait_share(self, nodes: Iterable[str], state: str, share: float, timeout: float) -> float | None:
        """Epoch seconds at which at least ``share`` of ``nodes`` were seen in ``state``; None on timeout."""
        names = list(nodes)
        wanted = share * len(names)
        with self.cond:
            ok = self.cond.wait_for(lambda: self.count(names, state) >= wanted, timeout)  # cond's lock is an RLock
            return time.time() if ok else None

    def tally(self, nodes: Iterable[str]) -> dict[str, int]:
        """How many of ``nodes`` are in each state now ("none": no verdict seen yet)."""
        with self.cond:
            return dict(Counter(self.states.get(n) or "none" for n in nodes))

    def count(self, nodes: Iterable[str], state: str) -> int:
        with self.cond:
            return sum(1 for n in nodes if self.states.get(n) == state)
