"""``make test``'s workers take each module whole, and the host's modules together (tests/conftest.py).

A module split over two workers sets its fixtures up twice: two control planes for one module's
tests, and for the host's modules a second real node beside the first on the same host. That is
what happened when xdist's ``xdist_group`` marks stopped working under pytest 9.2, silently: every
test still passed alone. So this runs real xdist workers over stand-in modules and reads back which
worker ran each test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import HOST_MODULES, scope_of

REPO = Path(__file__).resolve().parents[2]

MODULE = """
import os, time
from pathlib import Path

def _ran(name):
    time.sleep(0.05)
    with Path(os.environ["SCOPES_LOG"]).open("a") as f:
        f.write(f"{__name__} {name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

def test_1(): _ran("1")
def test_2(): _ran("2")
def test_3(): _ran("3")
"""


def test_scope_of_puts_the_hosts_modules_together_and_every_other_module_alone() -> None:
    assert {scope_of(f"tests/integration/{m}::test_x") for m in HOST_MODULES} == {"host"}
    assert scope_of("tests/integration/test_drain.py::test_x[a::b]") == "tests/integration/test_drain.py"
    assert scope_of("tests/unit/test_a.py::Cls::test_y") == "tests/unit/test_a.py"


def test_two_workers_never_split_a_module_nor_the_hosts_modules(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401\n")
    plain = ["test_one.py", "test_two.py", "test_three.py", "test_four.py"]
    for name in [*plain, *sorted(HOST_MODULES)]:
        (tmp_path / name).write_text(MODULE)
    log = tmp_path / "ran.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SCOPES_LOG": str(log)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(tmp_path),
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadscope",
            f"--rootdir={tmp_path}",
            "-c",
            os.devnull,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    for line in log.read_text().splitlines():
        module, _test, worker = line.split()
        workers[module].add(worker)
    assert sum(1 for _ in log.read_text().splitlines()) == 3 * (len(plain) + len(HOST_MODULES))
    split = {m: w for m, w in workers.items() if len(w) > 1}
    assert not split, f"modules run on more than one worker: {split}"
    host = {w for m, ws in workers.items() if f"{m}.py" in HOST_MODULES for w in ws}
    assert len(host) == 1, f"the host's modules ran on {sorted(host)}"
    assert len({w for ws in workers.values() for w in ws}) == 2, "both workers took work"
