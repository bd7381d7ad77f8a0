"""The cold-start timer's harness (``hack/coldstart``): it reads the build scripts' own timing lines and
pytest's summary, and the docs block says what the newest filed run says (the run itself is on
request: ``make coldstart``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hack import coldstart
from hack.coldstart import docs

LOG = """\
[hack/build] 16:05:02 building kwok v0.8.0
[hack/build] 16:40:10 control plane binaries ready in /c/bin/k8s (2108s)
[hack/build-node] 16:41:00   build_containerd took 233s
[hack/build] 16:42:00 control plane binaries ready in /c/bin/k8s (0s)
[hack/build-node] 16:44:10   build_kubelet took 130s
[hack/node-packages] 16:05:30 installed in 122s
[hack/build-image] 16:07:30   base image took 108s
[hack/build-image] 16:09:00 image localhost/gpuhealth:dev-abc built in 76s (409 MB)
[hack/build-kueue] 16:50:00 Kueue v0.17.0 ready in /c/bin/kueue (377s)
[hack/build-tools] 16:55:00 helm, promtool and prometheus ready in /c/bin/tools (290s)
[hack/build-nvidia-plugins] 16:58:00   build_binaries took 150s
[hack/build-nvidia-plugins] 16:58:30   build_image took 12s
[hack/build-nvidia-plugins] 16:58:30   build_image took 0s
........................................................................ [ 99%]
FAILED tests/x.py::test_y - AssertionError
1 failed, 1907 passed, 2 warnings in 1665.43s (0:27:45)
"""


def test_pieces_come_from_each_build_scripts_own_line_and_a_rerun_does_not_hide_the_build() -> None:
    got = coldstart.pieces(LOG.splitlines())
    assert got == {
        "control_plane": 2108,  # not the 0 s of the kubelet build's second look
        "containerd": 233,
        "kubelet": 130,
        "node_packages": 122,
        "python_base": 108,
        "image": 76,
        "kueue": 377,
        "helm_promtool": 290,
        "nvidia_plugins": 150,
        "nvidia_plugins_image": 12,  # not the 0 s of a second look
    }
    assert coldstart.pieces(["nothing here", "[hack/build] 1 building etcd"]) == {}
    # The line of the filed runs from before the script built the Prometheus server too.
    old = "[hack/build-tools] 16:55:00 helm and promtool ready in /c/bin/tools (12s)"
    assert coldstart.pieces([old]) == {"helm_promtool": 12}


def test_the_test_phase_comes_from_pytests_last_summary() -> None:
    got = coldstart.test_summary(LOG.splitlines())
    assert got == {"counts": {"failed": 1, "passed": 1907, "warnings": 2}, "pytest_s": 1665.4}
    assert coldstart.test_summary(["make: *** [Makefile:77: test] Error 2"]) == {}


def _result(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kind": "coldstart",
        "commit": "abc1234",
        "date": "2026-12-03T18:00:00Z",
        "machine": {"cpus": 2, "mem_gb": 23.4, "cpu_model": "x"},
        "load_before": [0.2, 0.1, 0.1],
        "load_after": [1.0, 1.0, 1.0],
        "command": "make test",
        "rc": 0,
        "wall_s": 2950.0,
        "pieces_s": coldstart.pieces(LOG.splitlines()),
        "node_packages_installed": True,
        "tests": coldstart.test_summary(LOG.splitlines()),
        "target_s": coldstart.TARGET_S,
        "met": False,
        "log_tail": [],
    }
    return {**base, **over}


def test_the_block_reports_a_miss_as_a_miss_and_names_every_piece() -> None:
    text = docs.render(_result())
    assert "**49 min 10 s**" in text and "**missed**" in text and "45-minute target" in text
    assert "1907 passed" in text and "27 min 45 s of pytest" in text
    for name in docs.NAMES.values():
        if name != docs.NAMES["pause_image"]:
            assert name in text
    met = docs.render(_result(wall_s=2000.0, met=True, node_packages_installed=False))
    assert ": met." in met and "already installed (apt not counted)" in met
    assert "No cold run is filed yet" in docs.render(None)


def test_the_newest_run_is_the_one_filed_last(tmp_path: Path) -> None:
    assert coldstart.newest(tmp_path) is None
    for date, commit in (("2026-12-03T10:00:00Z", "old1111"), ("2026-12-03T18:00:00Z", "new2222")):
        coldstart.file_result(_result(date=date, commit=commit), tmp_path)
    got = coldstart.newest(tmp_path)
    assert got is not None and got["commit"] == "new2222"
    assert json.loads((tmp_path / "coldstart-2026-12-03-old1111.json").read_text())["commit"] == "old1111"


def test_a_second_run_of_one_commit_on_one_day_is_a_file_of_its_own(tmp_path: Path) -> None:
    first = coldstart.file_result(_result(date="2026-12-07T00:06:30Z", commit="20d26b0"), tmp_path)
    second = coldstart.file_result(_result(date="2026-12-07T00:48:00Z", commit="20d26b0"), tmp_path)
    assert (first.name, second.name) == ("coldstart-2026-12-07-20d26b0.json", "coldstart-2026-12-07-20d26b0-2.json")
    assert json.loads(first.read_text())["date"] == "2026-12-07T00:06:30Z", "the first run is kept"
    got = coldstart.newest(tmp_path)
    assert got is not None and got["date"] == "2026-12-07T00:48:00Z"


def test_the_development_page_shows_the_newest_filed_run() -> None:
    assert docs.main(["--check"]) == 0, "docs/development.md is stale: run python -m hack.coldstart.docs"


def test_cpu_counters_split_at_pytests_start_into_each_phases_busy_share() -> None:
    stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n"
    assert coldstart.cpu_jiffies(stat) == (150, 1000)  # idle and iowait are not busy
    samples = [
        (0.0, "build", 0, 0),
        (10.0, "build", 190, 200),  # 95% busy while the tools build
        (20.0, "tests", 290, 400),  # 50% while the tests run
        (30.0, "tests", 390, 600),
    ]
    assert coldstart.cpu_by_phase(samples) == {"build": {"s": 10.0, "busy": 0.95}, "tests": {"s": 20.0, "busy": 0.5}}
    assert coldstart.cpu_by_phase(samples[:1]) == {}


def test_the_sampler_turns_to_the_test_phase_when_make_echoes_pytest(tmp_path: Path) -> None:
    log = tmp_path / "make.log"
    log.write_text("[hack/build] building\n")
    sampler = coldstart.CpuSampler(log, every=3600)
    sampler._sample()
    with log.open("a") as f:
        f.write(".venv/bin/python -m pytest tests -q\n")
    sampler._sample()
    sampler._sample()
    assert [s[1] for s in sampler.samples] == ["build", "tests", "tests"]
    assert all(s[3] >= s[2] > 0 for s in sampler.samples)


def test_the_block_says_how_busy_the_cpus_were_in_each_phase() -> None:
    cpu = {"build": {"s": 2100.0, "busy": 0.97}, "tests": {"s": 1270.0, "busy": 0.61}}
    text = docs.render(_result(cpu=cpu))
    assert "busy 97% while the tools built (35 min 00 s) and 61% while the tests ran (21 min 10 s)" in text
    assert "busy" not in docs.render(_result())


def test_the_block_says_whose_caches_the_run_filled() -> None:
    own = docs.render(_result(caches="the machine's own (its first make test)"))
    assert "Caches: the machine's own (its first make test)." in own
    assert "Caches:" not in docs.render(_result())  # runs filed before the field say nothing


def test_the_sampler_keeps_the_least_memory_available_in_each_phase(tmp_path: Path) -> None:
    meminfo = "MemTotal:       24641536 kB\nMemFree:         1000000 kB\nMemAvailable:    8388608 kB\n"
    assert coldstart.mem_available_kb(meminfo) == 8388608
    assert coldstart.mem_available_kb("MemTotal: 1 kB\n") is None  # a kernel that does not say
    log = tmp_path / "make.log"
    log.write_text("[hack/build] building\n")
    sampler = coldstart.CpuSampler(log, every=3600)
    sampler._sample()
    sampler._sample()
    assert set(sampler.least_available) == {"build"}
    total_kb = int(Path("/proc/meminfo").read_text().split()[1])  # MemTotal, the file's first line
    assert 0 < sampler.least_available["build"] <= total_kb


def test_the_block_says_how_little_memory_was_left() -> None:
    text = docs.render(_result(least_available_gb={"build": 9.3, "tests": 4.1}))
    assert "Memory available at its lowest (of 23.4 GB): 9.3 GB while the tools built and 4.1 GB while" in text
    assert "Memory available" not in docs.render(_result())  # runs filed before the field say nothing
