"""The MIG fleet's pure parts (hack/bench/mig.py, hack/bench/mig_report.py, the memory probe's MIG mode):
the slices and reports agree and the operator's own mapping finds a GPU's seven MIG devices in them, the
last-rule time, the rule check, the phase selection, and how the targets are judged, summarised and filed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devkit import dra
from gpuhealth.actions.gpudevices import devices_of_gpu
from gpuhealth.actions.slices import slim_slice
from gpuhealth.agent.report import AgentInfo, ReportBuilder, now_utc
from hack import memprobe
from hack.bench import docs
from hack.bench.cli import parse_args, parse_phases
from hack.bench.fleet import gpu_uuid, healthy_snapshot
from hack.bench.mig import MIG_GPU, gpu_devices, mig_layout, mig_slices, rule_problems
from hack.bench.mig_report import MIG_BEGIN, mig_line, mig_targets_for, render_mig
from hack.bench.report import evaluate, summary_md, tally
from hack.bench.targets import RATIO_MET, RATIO_MISSED, RATIO_UNMEASURED
from hack.bench.watch import NodeWatch, last_rule, last_writer

FILED = Path(docs.RESULTS) / "bench-1000-2026-11-30-8064aa5.json"
NODE = "gpu-node-0007"


def test_each_node_publishes_8_gpus_of_7_mig_devices_and_no_full_gpu() -> None:
    (body,) = mig_slices(NODE, 7).slices
    names = [d["name"] for d in body["spec"]["devices"]]
    assert len(names) == 56 and not any(n.startswith("gpu-") and "-mig-" not in n for n in names)
    assert [d for _, d in gpu_devices(NODE, 7, 3)] == [f"gpu-3-mig-1g10gb-19-{s}" for s in range(7)]
    assert {p for p, _ in gpu_devices(NODE, 7, 3)} == {NODE}


def test_the_report_and_the_slice_name_the_same_mig_devices_and_the_operator_maps_them() -> None:
    builder = ReportBuilder(NODE, AgentInfo(version="0", sources=("simulated",), boot_time=now_utc()))
    spec = builder.render(healthy_snapshot(7, mig=mig_layout(7)), now_utc())
    gpu3 = spec["devices"][MIG_GPU]
    assert gpu3["migMode"] == "Enabled" and len(gpu3["migDevices"]) == 7
    slim = [slim_slice(s) for s in mig_slices(NODE, 7).slices]
    by_name = {d.name: d for s in slim for d in s.devices}
    mine = {name for _, name in gpu_devices(NODE, 7, MIG_GPU)}
    assert {by_name[n].uuid for n in mine} == {m["uuid"] for m in gpu3["migDevices"]}
    assert {by_name[n].parent_uuid for n in mine} == {gpu_uuid(7, MIG_GPU)} == {gpu3["uuid"]}
    reported = [d["uuid"] for d in spec["devices"]]
    got = devices_of_gpu(slim, NODE, [dra.DRIVER], MIG_GPU, gpu3["uuid"], reported)
    assert sorted(r.device for r in got.refs) == sorted(mine) and got.partitions == got.refs


def test_the_last_rule_is_the_latest_of_all_seven_and_none_while_one_is_missing() -> None:
    devs = gpu_devices(NODE, 7, 3)
    seen = {d: 100.0 + i for i, d in enumerate(devs)}
    assert last_rule(seen, devs) == (100.0, 106.0)
    del seen[devs[4]]
    assert last_rule(seen, devs) is None
    assert last_rule(seen, []) is None


def _rule(pool: str, device: str, driver: str = dra.DRIVER) -> dict[str, Any]:
    sel = {k: v for k, v in (("driver", driver), ("pool", pool), ("device", device)) if v}
    return {"metadata": {"name": f"gpuhealth-{pool}-{device}"}, "spec": {"deviceSelector": sel}}


def test_rule_check_finds_empty_and_misplaced_selectors_and_missing_rules() -> None:
    expected = {NODE: {d for _, d in gpu_devices(NODE, 7, 3)}}
    good = [_rule(NODE, d) for d in sorted(expected[NODE])]
    assert rule_problems(good, expected) == []
    bad = [*good[1:], _rule(NODE, ""), _rule(NODE, "gpu-4-mig-1g10gb-19-0"), _rule("other", "gpu-3-mig-1g10gb-19-0")]
    bad.append({"metadata": {"name": "empty"}, "spec": {"deviceSelector": {}}})
    problems = rule_problems(bad, expected)
    assert len(problems) == 5, problems
    assert any("selector without device" in p for p in problems)
    assert any("selector without driver, pool, device" in p for p in problems)
    assert any("1 of its GPU's devices have no rule" in p for p in problems)


def test_mig_is_a_phase_of_its_own_and_all_means_what_it_did() -> None:
    assert parse_phases("mig") == ["mig"]
    assert parse_phases("drain,mig") == ["mig", "drain"]
    assert "mig" not in parse_phases("all")
    with pytest.raises(ValueError):
        parse_phases("core,mig")
    quick = parse_args(["--quick", "--phases", "mig"])
    assert (quick.nodes, quick.mig_faults, quick.mig_storm) == (100, 10, 20)
    assert (parse_args(["--phases", "mig"]).nodes, parse_args(["--phases", "mig"]).mig_faults) == (1000, 100)
    with pytest.raises(SystemExit):
        parse_args(["--nodes", "50", "--pods", "50", "--phases", "mig"])  # 100 + 100 faulted nodes


def test_the_mig_phase_can_take_a_share_of_the_fleet_and_the_10k_profile_does() -> None:
    assert parse_args(["--phases", "mig"]).mig_nodes == 1000  # default: every governed node
    assert parse_args(["--profile", "10k", "--phases", "mig"]).mig_nodes == 1000  # a tenth of 10,000
    assert parse_args(["--profile", "10k", "--phases", "mig", "--mig-nodes", "2000"]).mig_nodes == 2000
    with pytest.raises(SystemExit):
        parse_args(["--phases", "mig", "--mig-nodes", "150"])  # 100 + 100 faulted MIG nodes
    sample = _mig_run()
    sample["nodes"] = 10000
    assert "MIG fleet: 1,000 of 10,000 nodes x 8 GPUs" in mig_line(sample)
    assert "MIG fleet: 1,000 nodes x 8 GPUs" in mig_line(_mig_run())


def _mig_run(p50: float = 150.0, p99: float = 600.0, gpus_per_s: float = 25.0) -> dict[str, Any]:
    res: dict[str, Any] = {
        "nodes": 1000,
        "quick": False,
        "machine": "2 cores",
        "config": {"phases": ["mig"]},
        "operator": {"startup_s": 20.0},
        "phases": [["operator start-up", 60.0, 1.2]],
        "mig": {
            "shape": {
                "gpus_per_node": 8,
                "profile": "1g.10gb",
                "mig_devices_per_gpu": 7,
                "devices_per_node": 56,
                "nodes": 1000,
                "devices": 56000,
            },
            "fault_to_last_rule_ms": {
                "p50": p50,
                "p90": p99,
                "p99": p99,
                "max": p99,
                "samples": 100,
                "timeouts": 0,
                "first_rule_p50": 90.0,
                "nodes_tainted": 0,
            },
            "storm": {
                "gpus": 100,
                "rules_expected": 700,
                "rules": 700,
                "gpus_complete": 100,
                "seconds": 100 / gpus_per_s,
                "gpus_per_s": gpus_per_s,
                "rules_per_s": 7 * gpus_per_s,
                "publish_s": 1.2,
                "first_rule_s": 0.1,
                "publish_failures": 0,
                "report_to_last_rule_ms_p50": 1500.0,
                "report_to_last_rule_ms_max": 3900.0,
                "nodes_tainted": 0,
            },
            "rule_check": {"rules": 1400, "problems": 0, "examples": []},
            "recovery": {"gpus": 200, "seconds_to_all_rules_deleted": 9.5, "rules_left": 0},
            "operator_peak_rss_mb": 180.0,
            "operator_peak_rss_mb_in_phase": 175.0,
        },
    }
    res["targets"] = evaluate(res)
    return res


def test_the_mig_targets_are_judged_and_a_miss_stays_a_miss() -> None:
    res = _mig_run()
    assert tally(res["targets"], 1000, mig_targets_for) == (6, 6, 0)
    slow = _mig_run(p50=250.0, p99=1200.0, gpus_per_s=15.0)
    assert not any(slow["targets"][k]["pass"] for k in ("mig_p50", "mig_p99", "mig_storm_rate"))
    incomplete = copy.deepcopy(res)
    incomplete["mig"]["storm"]["gpus_complete"] = 99
    incomplete["mig"]["rule_check"]["problems"] = 2
    incomplete["mig"]["recovery"]["seconds_to_all_rules_deleted"] = None
    t = evaluate(incomplete)
    assert not t["mig_storm_rate"]["pass"] and not t["mig_rules"]["pass"] and not t["mig_recovery"]["pass"]
    old = json.loads(FILED.read_text(encoding="utf-8"))
    assert tally(evaluate(old), old["nodes"], mig_targets_for) == (0, 0, 6)  # filed before: not measured


def test_the_mig_fault_and_storm_are_judged_against_their_floors() -> None:
    res = _mig_run(p50=150.0, p99=600.0, gpus_per_s=25.0)
    res["floors"] = {
        "mig": {"p50": 80.0, "p99": 500.0, "samples": 50, "timeouts": 0},
        "mig_storm": {"items": 100, "seconds": 2.5, "per_s": 40.0, "timed_out": False},
    }
    t = evaluate(res)
    assert t["mig_p50"]["ratio"]["ratio"] == 1.88 and t["mig_p50"]["ratio"]["status"] == RATIO_MISSED
    assert t["mig_p99"]["ratio"]["ratio"] == 1.2 and t["mig_p99"]["ratio"]["status"] == RATIO_MET
    assert t["mig_storm_rate"]["ratio"]["ratio"] == 1.6 and t["mig_storm_rate"]["ratio"]["status"] == RATIO_MISSED
    res["floors"]["mig_storm"] = {"items": 100, "seconds": None, "per_s": None, "timed_out": True}
    res["floors"]["mig"]["timeouts"] = 1
    t = evaluate(res)
    assert {t[k]["ratio"]["status"] for k in ("mig_p50", "mig_p99", "mig_storm_rate")} == {RATIO_UNMEASURED}
    assert "MIG path (a GPU's seven rules) p50 80.0 ms" in summary_md({**res, "targets": t})


def test_a_mig_only_run_has_a_summary_of_its_own() -> None:
    md = summary_md(_mig_run())
    assert "phases mig" in md and "## MIG fleet (`--phases mig`)" in md and "never blind" not in md
    assert (
        "| MIG fault to the GPU's last DeviceTaintRule, p50 | 150.0 ms | - | no floor measured | unmeasured "
        "| <= 200 ms | pass |" in md
    )
    assert "1,000 nodes x 8 GPUs x 7 1g.10gb MIG devices = 56,000 DRA devices" in md


def test_a_filed_mig_run_feeds_only_the_mig_block(tmp_path: Path) -> None:
    core = json.loads(FILED.read_text(encoding="utf-8"))
    (tmp_path / FILED.name).write_text(json.dumps(core), encoding="utf-8")
    mig = _mig_run(p50=250.0)
    mig.update({"date": "2026-12-31T00:00Z", "commit": "abcdef0", "load": "1.0-2.0"})
    (tmp_path / "bench-1000-2026-12-31-abcdef0.json").write_text(json.dumps(mig), encoding="utf-8")
    assert not docs.core_run(mig)
    readme, summary, latest, _, resilience, _, mig_block, _, _, domain_block, _ = [
        *docs.blocks(tmp_path)[docs.DOCS[0]],
        *docs.blocks(tmp_path)[docs.DOCS[1]],
    ]
    assert readme == latest and f"`{core['commit']}`" in latest and "abcdef0" not in resilience + summary
    assert mig_block == render_mig((str(tmp_path / "bench-1000-2026-12-31-abcdef0.json"), mig))
    assert "No run of the domain storm is filed yet." in domain_block
    assert mig_block.startswith(MIG_BEGIN) and "**5 of 6 targets met**" in mig_block
    assert (
        "| MIG fault to the GPU's last DeviceTaintRule, p50 | 250.0 ms | - | no floor measured | unmeasured "
        "| <= 200 ms | **missed** |" in mig_block
    )


def test_memprobe_mig_renders_its_own_block_with_the_target() -> None:
    data = {
        "commit": "abc1234",
        "date": "2026-12-01T00:00:00Z",
        "machine": {"python": "3.11.7", "nproc": 2, "load_average": [1.0, 1.0, 1.0]},
        "fleet": {"gpus_per_node": 8, "pods_per_node": 8, "leases": True, "mig_profile": "1g.10gb"}
        | {"mig_devices_per_gpu": 7, "mig_devices_per_node": 56},
        "results": [{"nodes": 1000, "bytes": 30_720_000, "bytes_per_node": 30720}],
        "sites": {"nodes": 1000, "top": []},
        "slope_bytes_per_node": 30720,
        "intercept_bytes": 0,
    }
    block = memprobe.render(data, "results/bench/memprobe-mig-x.json")
    assert block.startswith(memprobe.MIG_BEGIN) and block.endswith(memprobe.MIG_END)
    assert "56 DRA devices in each node's ResourceSlice" in block
    assert "Target: <= 25 KiB per node with MIG slices: **missed**." in block
    data["slope_bytes_per_node"] = 20_000
    assert "MIG slices: met." in memprobe.render(data, "x")


def test_a_small_mig_probe_holds_more_per_node_than_without_mig() -> None:
    plain, mig = memprobe.probe_alone(10), memprobe.probe_alone(10, mig=True)
    assert mig > plain + 10 * 56 * 50  # at least 50 bytes for each MIG device


def test_the_storm_says_where_its_cpu_went_when_the_run_measured_it() -> None:
    res = _mig_run()
    assert "CPU over the storm" not in summary_md(res)  # runs filed before measured none
    res["mig"]["storm"]["cpu"] = {
        "wall_s": 8.8,
        "cores": 2,
        "machine_busy": 0.97,
        "cpu_s": {"kube-apiserver": 9.1, "operator-1": 4.2, "bench": 2.5, "etcd": 1.1},
    }
    md = summary_md(res)
    assert "CPU over the storm's 8.8 s on 2 cores: kube-apiserver 9.1 s, operator-1 4.2 s, bench 2.5 s" in md
    assert "the machine 97% busy" in md


def test_the_storms_cpu_names_the_busiest_processes_first_whatever_order_the_file_keeps() -> None:
    res = _mig_run()
    names = ["bench", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "operator"]
    seconds = [1.8, 0.8, 10.5, 0.4, 1.3, 0.4, 2.2]
    res["mig"]["storm"]["cpu"] = {
        "wall_s": 8.9,
        "cores": 2,
        "machine_busy": 1.0,
        "cpu_s": dict(zip(names, seconds, strict=True)),
    }
    assert (
        "kube-apiserver 10.5 s, operator 2.2 s, bench 1.8 s, kube-scheduler 1.3 s, etcd 0.8 s, "
        "kube-controller-manager 0.4 s, the machine 100% busy"
    ) in summary_md(res)


def test_the_storm_says_who_changed_the_nodes_and_where_its_floors_cpu_went() -> None:
    res = _mig_run()
    md = summary_md(res)
    assert "Node changes heard" not in md and "floor's storm" not in md  # runs filed before recorded neither
    res["mig"]["storm"]["node_writes"] = {"gpuhealth-operator": 100, "kwok": 9_812}
    res.setdefault("floors", {})["mig_storm"] = {
        "items": 100,
        "seconds": 17.6,
        "concurrency": 16,
        "per_s": 5.7,
        "cpu": {"wall_s": 17.7, "cores": 2, "machine_busy": 1.0, "cpu_s": {"kwok": 0.3, "kube-apiserver": 12.0}},
        "node_writes": {},
    }
    md = summary_md(res)
    assert "Node changes heard over the storm, by their last writer: kwok 9,812, gpuhealth-operator 100." in md
    assert "CPU over its floor's storm's 17.7 s on 2 cores: kube-apiserver 12.0 s, kwok 0.3 s" in md
    assert "Node changes heard over the floor's storm: none." in md


def test_a_nodes_last_writer_is_the_manager_of_its_newest_managed_fields_entry() -> None:
    def node(*entries: tuple[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": "n", "managedFields": [{"manager": m, "time": t} for m, t in entries]}}

    assert last_writer(node(("kwok", "2026-12-07T10:00:01Z"), ("gpuhealth-operator", "2026-12-07T10:00:00Z"))) == "kwok"
    # Equally new (one-second resolution): the later entry.
    assert last_writer(node(("kwok", "2026-12-07T10:00:01Z"), ("bench", "2026-12-07T10:00:01Z"))) == "bench"
    assert last_writer({"metadata": {"name": "n"}}) == ""
    watch = NodeWatch(client.ApiClient())  # never started: its events are fed by hand
    watch._event("ADDED", node(("kwok", "2026-12-07T10:00:00Z")))
    for writer, at in (("kwok", "2026-12-07T10:00:02Z"), ("gpuhealth-operator", "2026-12-07T10:00:03Z")):
        watch._event("MODIFIED", node(("kwok", "2026-12-07T10:00:00Z"), (writer, at)))
    watch._event("MODIFIED", {"metadata": {"name": "n"}})
    heard = [t for t, _ in watch.writes]
    assert len(heard) == 3  # the ADDED event is no change
    assert watch.writers_between(heard[0], heard[-1] + 1) == {"kwok": 1, "gpuhealth-operator": 1, "unknown": 1}
    assert watch.writers_between(heard[-1] + 1, heard[-1] + 2) == {}


def test_the_mig_block_keeps_the_newest_run_of_each_size(tmp_path: Path) -> None:
    small = _mig_run(p50=250.0)
    small.update({"date": "2026-12-31T00:00Z", "commit": "abcdef0", "load": "1.0-2.0"})
    older = {**copy.deepcopy(small), "date": "2026-12-30T00:00Z", "commit": "0000000"}
    large = copy.deepcopy(small)
    large.update({"nodes": 10000, "date": "2027-01-01T00:00Z", "commit": "1234567"})
    large["operator"]["startup_profile"] = {
        "window_s": 10.0,
        "workers": 16,
        "writes": 3,
        "nodes_written": 1,
        "writes_by_kind": {"patch nodes": 3},
        "writes_per_s": 0.3,
        "server_ms": {"p50": 100.0, "p99": 200.0},
        "in_flight_mean": 1.0,
        "waiting_on_server_share": 0.5,
        "all_workers_in_server_share": 0.0,
        "none_in_server_share": 0.5,
    }
    for r in (older, small, large):
        (tmp_path / f"bench-{r['nodes']}-{r['date'][:10]}-{r['commit']}.json").write_text(json.dumps(r), "utf-8")
    mig_block = docs.blocks(tmp_path)[docs.DOCS[1]][4]
    assert mig_block.startswith(MIG_BEGIN) and mig_block.count("Latest filed run of the MIG fleet") == 2
    assert mig_block.index("`abcdef0`") < mig_block.index("`1234567`") and "`0000000`" not in mig_block
    # The 10,000-node run measured what its start-up waited on; the other did not and says nothing of it.
    assert mig_block.count("Start-up writes (the audit log") == 1
