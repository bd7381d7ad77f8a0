"""A cold ``make test``, timed: what a fresh machine pays before and while the tests run.

``python -m hack.coldstart`` (``make coldstart``) clones the repository's HEAD into a scratch folder and
runs ``make test`` there with every cache the build reads pointed at empty folders of its own: the
tool cache (``GPUHEALTH_CACHE``: control plane, Kueue, helm, promtool, containerd, kubelet, the
image, NVIDIA's device plugin and GFD, and the podman storage), Go's module and build caches
(``GOMODCACHE``, ``GOCACHE``) and pip's.
Only what the host itself holds stays: the Go toolchain, and the Debian packages of the real-node
tier if an earlier run installed them (the result says whether the run had to; ``--fresh-host`` purges
them first, so the run pays for them as a new machine does). ``--own-caches`` uses the machine's own
caches instead of empty ones: on a machine that is itself new, its first ``make test``, timed, after
which the caches stay filled.

The build scripts print how long each piece took (``hack/build-*.sh``); :func:`pieces` reads those
lines from the log, the test phase comes from pytest's summary line, and the whole from the wall
clock. While it runs, the machine's CPU counters (``/proc/stat``) are sampled and split at the moment
pytest starts, so the result says how busy the two CPUs were while the tools built and while the tests
ran: a phase that leaves them idle is time another phase could have used. The result is filed in
``results/build/`` and rendered into docs/development.md by ``python -m hack.coldstart.docs``. Not a
test: it takes most of an hour on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from devkit.filing import free_name

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "build"
TARGET_S = 45 * 60  # a cold `make test` on a fresh machine, all tool builds included

# Each piece as its build script reports it: (name, pattern whose last group is seconds).
PIECES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("control_plane", re.compile(r"^\[hack/build\] \S+ control plane binaries ready in .*\((\d+)s\)")),
    ("kueue", re.compile(r"^\[hack/build-kueue\] \S+ Kueue \S+ ready in .*\((\d+)s\)")),
    # "helm and promtool" before the script built the Prometheus server too (filed runs say so).
    (
        "helm_promtool",
        re.compile(r"^\[hack/build-tools\] \S+ helm(?:, promtool and prometheus| and promtool) ready in .*\((\d+)s\)"),
    ),
    ("node_packages", re.compile(r"^\[hack/node-packages\] \S+ installed in (\d+)s")),
    ("containerd", re.compile(r"^\[hack/build-node\] \S+\s+build_containerd took (\d+)s")),
    ("kubelet", re.compile(r"^\[hack/build-node\] \S+\s+build_kubelet took (\d+)s")),
    ("pause_image", re.compile(r"^\[hack/build-node\] \S+\s+build_pause took (\d+)s")),
    ("python_base", re.compile(r"^\[hack/build-image\] \S+\s+base image took (\d+)s")),
    ("image", re.compile(r"^\[hack/build-image\] \S+ image \S+ built in (\d+)s")),
    ("nvidia_plugins", re.compile(r"^\[hack/build-nvidia-plugins\] \S+\s+build_binaries took (\d+)s")),
    ("nvidia_plugins_image", re.compile(r"^\[hack/build-nvidia-plugins\] \S+\s+build_image took (\d+)s")),
)
# The line make echoes when the test phase starts (the Makefile's `test` recipe).
PYTEST_STARTS = "-m pytest tests"
_SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<secs>[\d.]+)s")


def pieces(lines: Iterable[str]) -> dict[str, int]:
    """Seconds per piece, from the build scripts' own lines. A script that runs twice (the kubelet's
    build runs the control plane's, which then finds everything built) counts its longest run."""
    out: dict[str, int] = {}
    for line in lines:
        for name, pattern in PIECES:
            m = pattern.match(line.strip())
            if m:
                out[name] = max(out.get(name, 0), int(m.group(1)))
    return out


def test_summary(lines: Iterable[str]) -> dict[str, Any]:
    """pytest's last summary line: counts by outcome and its own seconds ({} if it never ran)."""
    found: dict[str, Any] = {}
    for line in lines:
        m = _SUMMARY.match(line.strip())
        if m:
            counts = {w: int(n) for n, w in (c.split(" ", 1) for c in m.group("counts").split(", "))}
            found = {"counts": counts, "pytest_s": round(float(m.group("secs")), 1)}
    return found


# One sample: (seconds since start, phase, busy jiffies, all jiffies), the counters cumulative.
Sample = tuple[float, str, int, int]


def cpu_jiffies(stat: str) -> tuple[int, int]:
    """(busy, all) from /proc/stat's aggregate ``cpu`` line; idle and iowait count as not busy."""
    fields = [int(x) for x in stat.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already inside user and nice
    return total - idle, total


def mem_available_kb(meminfo: str) -> int | None:
    """``MemAvailable`` from /proc/meminfo, in kB (None where the kernel does not say)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return None


def cpu_by_phase(samples: list[Sample]) -> dict[str, dict[str, float]]:
    """Seconds and the share of the CPUs kept busy in each phase, from consecutive samples: the
    interval between two samples belongs to the later sample's phase."""
    acc: dict[str, list[float]] = {}
    for (t0, _, b0, a0), (t1, phase, b1, a1) in pairwise(samples):
        got = acc.setdefault(phase, [0.0, 0.0, 0.0])
        got[0] += t1 - t0
        got[1] += b1 - b0
        got[2] += a1 - a0
    return {p: {"s": round(s, 1), "busy": round(b / a, 3) if a else 0.0} for p, (s, b, a) in acc.items()}


class CpuSampler:
    """Samples /proc/stat every ``every`` seconds in a thread; the phase turns from ``build`` to
    ``tests`` when the make log shows pytest starting."""

    def __init__(self, log_path: Path, every: float = 2.0) -> None:
        self.log_path, self.every = log_path, every
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()
        self._phase, self._seen = "build", 0
        # The least memory left for new work in each phase (kB): what the builds and the tests peaked at.
        self.least_available: dict[str, int] = {}

    def _sample(self) -> None:
        if self._phase == "build":
            # Read on from the last look, a little before it, so a line written across two looks is seen.
            with self.log_path.open("rb") as f:
                f.seek(max(0, self._seen - len(PYTEST_STARTS)))
                chunk = f.read()
                self._seen = f.tell()
            if PYTEST_STARTS.encode() in chunk:
                self._phase = "tests"
        busy, total = cpu_jiffies(Path("/proc/stat").read_text())
        self.samples.append((time.monotonic() - self._t0, self._phase, busy, total))
        avail = mem_available_kb(Path("/proc/meminfo").read_text())
        if avail is not None:
            low = self.least_available.get(self._phase)
            self.least_available[self._phase] = avail if low is None else min(low, avail)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def machine() -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    mem_kb = next((int(line.split()[1]) for line in meminfo if line.startswith("MemTotal")), 0)
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), "")
    return {"cpus": os.cpu_count(), "mem_gb": round(mem_kb / 2**20, 1), "cpu_model": model}


def load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


# What hack/install-node-packages.sh installs: purged by --fresh-host, so a run pays for them as a new machine does.
NODE_PACKAGES = ("runc", "containernetworking-plugins", "nftables", "podman", "mmdebstrap")


def purge_node_packages() -> None:
    """Remove the real node's Debian packages and what came with them (root only), as on a new machine."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "-y", "-qq"]
    subprocess.run([*apt, "purge", *NODE_PACKAGES], env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*apt, "autoremove", "--purge"], env=env, check=True, stdout=subprocess.DEVNULL)


def run(scratch: Path, make_args: tuple[str, ...] = ("test",), own_caches: bool = False) -> dict[str, Any]:
    """Clone HEAD into ``scratch`` and run ``make test`` there with empty caches; the result record.

    ``own_caches``: the machine's own caches instead of empty ones of the scratch folder, for a machine
    that is itself fresh (its first ``make test``): they stay filled for every run after it."""
    clone, caches = scratch / "clone", scratch / "caches"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True)
    env = dict(os.environ)
    if not own_caches:
        env |= {
            "GPUHEALTH_CACHE": str(caches / "gpuhealth"),
            "GOMODCACHE": str(caches / "gomod"),
            "GOCACHE": str(caches / "gobuild"),
            "PIP_CACHE_DIR": str(caches / "pip"),
        }
    log_path = scratch / "make-test.log"
    before = load()
    t0 = time.monotonic()
    with log_path.open("w") as log, CpuSampler(log_path) as sampler:
        rc = subprocess.run(["make", *make_args], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    lines = log_path.read_text(errors="replace").splitlines()
    got = pieces(lines)
    tests = test_summary(lines)
    return {
        "kind": "coldstart",
        "commit": _git("rev-parse", "--short", "HEAD", cwd=clone),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "load_before": before,
        "load_after": load(),
        "command": "make " + " ".join(make_args),
        "caches": "the machine's own (its first make test)" if own_caches else "empty, of the scratch folder",
        "rc": rc,
        "wall_s": round(wall, 1),
        "pieces_s": got,
        "node_packages_installed": "node_packages" in got,
        "tests": tests,
        "cpu": cpu_by_phase(sampler.samples),
        "least_available_gb": {p: round(kb / 2**20, 1) for p, kb in sampler.least_available.items()},
        "target_s": TARGET_S,
        "met": rc == 0 and wall <= TARGET_S,
        "log_tail": lines[-40:],
    }


def file_result(result: dict[str, Any], out: Path = RESULTS) -> Path:
    """File one run; a second run of the same commit on the same day gets ``-2`` (``-3``, ...), never the
    first one's name: the two runs an issue asks for are two files."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"coldstart-{result['date'][:10]}-{result['commit']}"
    path = free_name(out, stem)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def newest(out: Path = RESULTS) -> dict[str, Any] | None:
    """The newest filed result, by its date (then its name)."""
    runs = [(json.loads(p.read_text()), p.name) for p in out.glob("coldstart-*.json")]
    return max(runs, key=lambda r: (r[0]["date"], r[1]))[0] if runs else None


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scratch", type=Path, help="where to clone and cache (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (clone, caches, log)")
    ap.add_argument("--no-file", action="store_true", help="print the result, file nothing")
    ap.add_argument(
        "--fresh-host",
        action="store_true",
        help="first purge the real node's Debian packages (root), so the run installs them as a new machine does",
    )
    ap.add_argument(
        "--own-caches",
        action="store_true",
        help="use the machine's own caches (a fresh machine's first make test; they stay filled)",
    )
    args = ap.parse_args(argv)
    if _git("status", "--porcelain", "--untracked-files=no"):
        print("note: uncommitted changes are not part of the clone; the run times HEAD", file=sys.stderr)
    if args.fresh_host:
        purge_node_packages()
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="gpuhealth-coldstart-"))
    try:
        result = run(scratch, own_caches=args.own_caches)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}, indent=2))
    if not args.no_file:
        print(f"filed {file_result(result)}; render with: python -m hack.coldstart.docs", file=sys.stderr)
    return 0 if result["rc"] == 0 else 1
