"""Opt-in stack profile: where the operator's threads spend their time, written while it runs.

A slow drain or a backlog can be the operator's own work (the event loop busy deciding, slimming,
serialising) or waiting on the API server (pool threads blocked reading answers). The two look
alike from outside. With ``--stack-profile PATH`` a daemon thread samples every thread's stack
``sample_hz`` times a second (``sys._current_frames``, no tracing hook, so the rest of the process
runs at full speed between samples) and every ``interval_s`` appends one JSON line to PATH: the
window's wall-clock end, the samples taken, per thread group how many samples found it busy or
waiting, and the busy samples' stacks, folded (``outermost;...;innermost``, the flame graph
format). A stack whose innermost frame is a known wait (the event loop's selector, a lock, a
socket read) counts as waiting and is kept apart, so the busy stacks are the CPU the operator
spends. Off by default; each line reports the sampler's own time so it can be subtracted.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

_STDLIB = re.compile(r"/lib/python\d+\.\d+/")
DEPTH = 14  # innermost frames kept per stack: enough to name the caller in gpuhealth's code
# (file name suffix, function) of the innermost frame of a thread that is waiting, not working.
WAITS: frozenset[tuple[str, str]] = frozenset(
    {
        ("selectors.py", "select"),
        ("threading.py", "wait"),
        ("threading.py", "_wait_for_tstate_lock"),
        ("queue.py", "get"),
        ("thread.py", "_worker"),  # concurrent.futures: an idle pool thread
        ("socket.py", "readinto"),
        ("ssl.py", "read"),
        ("ssl.py", "recv_into"),
        ("ssl.py", "do_handshake"),
        ("socket.py", "create_connection"),
        ("connection.py", "create_connection"),
        ("time.py", "sleep"),
        ("wait.py", "do_poll"),  # urllib3: waiting for the API server's answer (or a pooled socket) to be readable
        ("wait.py", "do_select"),
    }
)


def frame_name(frame: FrameType) -> str:
    """``module-path:function``, the path cut after ``site-packages/``, ``operator/`` or the standard
    library's ``lib/pythonX.Y/``, so one frame reads the same on every machine."""
    path = frame.f_code.co_filename
    for cut in ("site-packages/", "operator/"):
        i = path.rfind(cut)
        if i != -1:
            return f"{path[i + len(cut) :]}:{frame.f_code.co_name}"
    m = _STDLIB.search(path)
    return f"{path[m.end() :] if m else path}:{frame.f_code.co_name}"


def stack_of(frame: FrameType | None, depth: int = DEPTH) -> list[FrameType]:
    """The innermost ``depth`` frames, outermost first."""
    out: list[FrameType] = []
    while frame is not None and len(out) < depth:
        out.append(frame)
        frame = frame.f_back
    return out[::-1]


def waiting(stack: list[FrameType]) -> bool:
    """Whether the innermost frame is a known wait (see ``WAITS``)."""
    if not stack:
        return True
    code = stack[-1].f_code
    return any(code.co_filename.endswith(f) and code.co_name == fn for f, fn in WAITS)


def group_of(thread_name: str) -> str:
    """Threads by role: the event loop, the API call pools, the rest (watches, Kopf, clients)."""
    if thread_name == "MainThread":
        return "event-loop"
    for prefix in ("kube", "drain"):
        if thread_name.startswith(prefix + "_"):
            return f"{prefix}-pool"
    return "other"


class Window:
    """One interval's samples: counts per thread group and the busy stacks, folded."""

    def __init__(self) -> None:
        self.samples = 0
        self.busy: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self.stacks: Counter[str] = Counter()

    def add(self, threads: Iterable[tuple[str, list[FrameType]]]) -> None:
        self.samples += 1
        for name, stack in threads:
            group = group_of(name)
            if waiting(stack):
                self.waiting[group] += 1
            else:
                self.busy[group] += 1
                self.stacks[group + ";" + ";".join(frame_name(f) for f in stack)] += 1

    def line(self, at: float, hz: float, sampler_s: float) -> dict[str, Any]:
        groups = sorted(set(self.busy) | set(self.waiting))
        return {
            "at": round(at, 3),
            "hz": hz,
            "samples": self.samples,
            "sampler_s": round(sampler_s, 3),
            "groups": {g: {"busy": self.busy[g], "waiting": self.waiting[g]} for g in groups},
            "stacks": dict(self.stacks.most_common()),
        }


def self_time(stacks: Mapping[str, int], top: int = 20) -> list[tuple[str, int]]:
    """The innermost frames that the busy samples were in, most first (where the CPU went)."""
    counts: Counter[str] = Counter()
    for folded, n in stacks.items():
        counts[folded.rsplit(";", 1)[-1]] += n
    return counts.most_common(top)


def inclusive_time(stacks: Mapping[str, int], prefix: str = "gpuhealth/", top: int = 20) -> list[tuple[str, int]]:
    """gpuhealth's frames by the busy samples they were on the stack of (each frame once per stack)."""
    counts: Counter[str] = Counter()
    for folded, n in stacks.items():
        for name in set(folded.split(";")[1:]):
            if name.startswith(prefix):
                counts[name] += n
    return counts.most_common(top)


class StackProfiler:
    """A daemon thread that samples every thread's stack into a JSON-lines file."""

    def __init__(self, path: Path, sample_hz: float = 50.0, interval_s: float = 10.0) -> None:
        self._path = path
        self._hz = min(200.0, max(1.0, sample_hz))
        self._interval = max(1.0, interval_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-profile", daemon=True)

    def start(self) -> StackProfiler:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        log.info("stack profile at %.0f Hz, a line every %.0fs, to %s", self._hz, self._interval, self._path)
        return self

    def stop(self) -> None:
        self._stop.set()

    def sample(self, window: Window) -> None:
        me = threading.get_ident()
        names = {t.ident: t.name for t in threading.enumerate()}
        frames = sys._current_frames()
        window.add((names.get(ident, "?"), stack_of(f)) for ident, f in frames.items() if ident != me)

    def _run(self) -> None:
        period = 1.0 / self._hz
        while not self._stop.is_set():
            window, spent = Window(), 0.0
            end = time.monotonic() + self._interval
            while not self._stop.is_set() and time.monotonic() < end:
                t = time.perf_counter()
                try:
                    self.sample(window)
                except Exception:  # a diagnostic must never take the operator down
                    log.exception("stack sample failed")
                spent += time.perf_counter() - t
                self._stop.wait(period)
            try:
                with self._path.open("a") as out:
                    out.write(json.dumps(window.line(time.time(), self._hz, spent)) + "\n")
            except OSError:
                log.exception("stack profile write failed")


def summarize(lines: Iterable[Mapping[str, Any]], since: float = 0.0, until: float = float("inf")) -> dict[str, Any]:
    """The windows that ended in [since, until], summed: each thread group's busy share of the
    samples, and where the busy samples were (innermost frames, and gpuhealth's frames inclusive)."""
    samples, sampler_s, windows = 0, 0.0, 0
    busy: Counter[str] = Counter()
    wait: Counter[str] = Counter()
    stacks: Counter[str] = Counter()
    for line in lines:
        if not since <= float(line.get("at", 0)) <= until:
            continue
        windows += 1
        samples += int(line.get("samples", 0))
        sampler_s += float(line.get("sampler_s", 0))
        for group, n in (line.get("groups") or {}).items():
            busy[group] += int(n.get("busy", 0))
            wait[group] += int(n.get("waiting", 0))
        stacks.update({k: int(v) for k, v in (line.get("stacks") or {}).items()})
    return {
        "windows": windows,
        "samples": samples,
        "sampler_s": round(sampler_s, 3),
        # busy thread-samples per sample: 1.0 is one thread busy all the time (a core, under the GIL at most)
        "busy_threads": {g: round(busy[g] / samples, 3) if samples else 0.0 for g in sorted(busy | wait)},
        "self": self_time(stacks),
        "gpuhealth": inclusive_time(stacks),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuhealth.controller.process.stackprofile FILE [--since T] [--until T]``: the summary."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m gpuhealth.controller.process.stackprofile")
    ap.add_argument("file", type=Path)
    ap.add_argument("--since", type=float, default=0.0, help="unix time: windows ending before are left out")
    ap.add_argument("--until", type=float, default=float("inf"), help="unix time: windows ending after are left out")
    args = ap.parse_args(argv)
    lines = [json.loads(raw) for raw in args.file.read_text().splitlines() if raw.strip()]
    print(json.dumps(summarize(lines, args.since, args.until), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
