"""One child process of the test control plane (etcd, kube-apiserver, ...): started in a session of
its own with its output in a log file, and stopped by its own pid only."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Proc:
    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if not self.popen or self.popen.poll() is not None:
            return
        self.popen.send_signal(sig)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)
