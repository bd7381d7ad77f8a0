"""The kill monkey: SIGKILLs the operator at random instants and restarts it.

Not only while it runs: a kill may also land during start-up (before its metrics answer, while it
lists what it watches) or during the resync right after (its first reconciles of everything), with
no settling time before it. Those are the windows where a restarted operator rebuilds its caches
from the API and must not repeat or forget a write.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable

from devkit.k8s import OperatorProcess
from gpuhealth.workload import REQUESTED
from hack.chaos.scenarios.context import Ctx

# How a bounce's restarted operator meets its next SIGKILL: after a random gap while it runs (the
# monkey's loop), during start-up, or during the resync right after its metrics answer.
MODES = ("running", "running", "startup", "resync")


class KillMonkey:
    def __init__(self, ctx: Ctx, op: OperatorProcess, gap: tuple[float, float], down: tuple[float, float]) -> None:
        self.ctx, self.op, self.gap, self.down = ctx, op, gap, down
        self.kills = 0
        self.targeted = 0
        self.by_mode: dict[str, int] = {}
        self._lock = threading.Lock()
        self.stop = ctx.background(self._loop, "kill-monkey")

    def _kill(self, mode: str) -> None:
        self.op.kill()
        self.kills += 1
        self.by_mode[mode] = self.by_mode.get(mode, 0) + 1
        self.ctx.fault(kind="operator_kill")

    def bounce(self, why: str = "random", after_kill: Callable[[], None] | None = None) -> None:
        """SIGKILL now, restart after a random pause; maybe SIGKILL again during start-up or resync
        (one bounce at a time). ``after_kill`` looks at the API while the operator is dead. Always
        leaves the operator started and ready."""
        rng = self.ctx.rng
        with self._lock:
            self._kill("running" if why == "random" else why)
            if after_kill is not None:
                after_kill()
            self.targeted += why != "random"
            time.sleep(rng.uniform(*self.down))
            mode = rng.choice(MODES) if why == "random" and not self.stop.is_set() else "running"
            if mode == "startup":
                self.op.start(wait=False)
                time.sleep(rng.uniform(0.0, 2.0))  # the process imports, logs in, lists its watches
                self._kill("startup")
            elif mode == "resync":
                self.op.start(wait=False)
                self._wait_metrics()
                time.sleep(rng.uniform(0.0, 0.5))  # its first reconciles of everything it listed
                self._kill("resync")
            self.op.start()

    def _wait_metrics(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.op.metrics_port}/metrics", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.ctx.rng.uniform(*self.gap)):
            self.bounce()

    def at_first_checkpoint_request(self, ns: str) -> None:
        """Also SIGKILL at the instant the first checkpoint request of a drain lands on a pod: between the
        pod writes and the drain record (the narrowest write-ahead gap of a drain)."""

        def watch(stop: threading.Event) -> None:
            while not stop.wait(0.03):
                try:
                    pods = self.ctx.kube.core.list_namespaced_pod(ns).items
                except Exception:
                    continue
                if any((p.metadata.annotations or {}).get(REQUESTED) for p in pods):
                    self.bounce("first checkpoint request")
                    return

        self.ctx.background(watch, "kill-at-first-request")

    def finish(self) -> None:
        # Under the lock: a bounce in progress restarts the operator itself; starting it here too
        # would leave a second, untracked operator running into the next scenarios.
        self.stop.set()
        with self._lock:
            if self.op.popen is None or self.op.popen.poll() is not None:
                self.op.start()
