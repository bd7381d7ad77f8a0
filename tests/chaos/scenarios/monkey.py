"""The kill monkey: SIGKILLs the operator at random instants and restarts it."""

from __future__ import annotations

import threading
import time

from gpuhealth.workload import REQUESTED
from tests.chaos.scenarios.context import Ctx
from tests.support.k8s import OperatorProcess


class KillMonkey:
    """SIGKILLs the operator at random instants and restarts it after a random pause."""

    def __init__(self, ctx: Ctx, op: OperatorProcess, gap: tuple[float, float], down: tuple[float, float]) -> None:
        self.ctx, self.op, self.gap, self.down = ctx, op, gap, down
        self.kills = 0
        self.targeted = 0
        self._lock = threading.Lock()
        self.stop = ctx.background(self._loop, "kill-monkey")

    def bounce(self, why: str = "random") -> None:
        """SIGKILL now, restart after a random pause (one at a time)."""
        with self._lock:
            self.op.kill()
            self.kills += 1
            self.targeted += why != "random"
            self.ctx.fault(kind="operator_kill")
            time.sleep(self.ctx.rng.uniform(*self.down))
            self.op.start()

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
