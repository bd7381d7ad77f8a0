"""`make demo`'s pure parts: the MIG node's two views agree, the fabric story's fake NVML masks decode
as the operator reads them, the pass/fail check names misses, the summary keys are documented,
`make demo KUEUE=1`'s timeline rows and summary fields read from the Workload, and what
`make demo REAL_NODE=1` must show."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from devkit import dra_shapes as S
from gpuhealth.api import fabric as api_fabric
from hack.demo import deviceplugin, fabric, kueue, mig, realnode, run
from hack.demo.common import DEMO_POLICY

DEVELOPMENT = Path(__file__).resolve().parents[2] / "docs" / "development.md"

NODE = "gpu-node-0003"


def test_the_mig_nodes_fake_nvml_and_its_slices_publish_the_same_mig_devices() -> None:
    nvml = {}
    for line in mig.scenario(NODE):
        words = line.split()
        if words[2] == "mig_device":
            nvml[words[-1]] = int(words[1])  # MIG UUID -> GPU index
    published = S.static_slices(NODE, mig.gpus(NODE))
    slices = {
        d["attributes"]["uuid"]["string"]: int(d["name"].split("-")[1])
        for s in published.slices
        for d in s["spec"]["devices"]
    }
    assert nvml == slices and len(nvml) == 16
    assert all(d["attributes"]["type"]["string"] == "mig" for s in published.slices for d in s["spec"]["devices"])
    assert mig.device_names(mig.BAD_GPU) == ["gpu-5-mig-3g40gb-9-0", "gpu-5-mig-3g40gb-9-4"]


def good() -> dict[str, Any]:
    return {
        "quarantined_nodes": ["x"],
        "devices_quarantined": [{"node": "h", "gpu": 2}, {"node": "m", "gpu": mig.BAD_GPU}],
        "gpus_kept_in_service": 14,
        "ignored_faults": [{"node": "a"}],
        "checkpoints_requested": 8,
        "checkpoints_acknowledged": 8,
        "rescheduled_pods": 4,
        "partitions_held_out": [{"device": d} for d in mig.device_names(mig.BAD_GPU)],
        "partitions_kept_in_service": 14,
        "gpus_reset": [{"node": "r", "gpu": 1}],
        "reset_ladder": {"history": [{"step": "GPUReset", "result": "Succeeded"}]},
        "validations": [{"node": "r", "gpu": 1, "result": "Passed"}],
        "fabric": fabric.fabric_summary(["n0", "n1", "n2", "n3"], ["ImexDomain"], 0.8, 4, 4, 6.1, [1.0, 1.2]),
        "rack": fabric.rack_summary(["n0", "n1", "n2"], 2.0, ["Degraded"] * 3, []),
    }


def test_check_passes_a_complete_run_and_names_each_missing_story() -> None:
    assert run.check(good(), "x", "h", "m", "r", 1) == []
    bad = good() | {"gpus_reset": [], "partitions_held_out": [], "reset_ladder": {}, "validations": []}
    misses = run.check(bad, "x", "h", "m", "r", 1)
    assert len(misses) == 4
    assert "reset Jobs" in misses[1] and "MIG devices held out" in misses[0] and "ladder history" in misses[2]
    assert "validations" in misses[3]


# -- make demo REAL_NODE=1 -------------------------------------------------------------------------------


def device_plugin() -> dict[str, Any]:
    return {
        "node": "x",
        "gpu": 4,
        "uuid": "GPU-4",
        "allocatable_withheld": 7,
        "allocatable_while_restarting": 0,
        "allocatable_after_repair": 8,
        "moved_pods": ["ml/dp-a"],
        "kept_pod": {"pod": "ml/dp-b", "gpu": 6, "same_uid": True, "restarts": 0, "phase": "Running"},
        "node_tainted_or_cordoned": False,
        "reset_jobs": ["gpuhealth-reset-x-4-1-abc: Complete"],
        "validation_jobs": ["gpuhealth-validate-x-4-1-abc: Complete"],
        "plugin_restarted": True,
        "returned_while_withheld": False,
        "returned_s": 41.0,
    }


def real() -> dict[str, Any]:
    ranks = {f"llm-pretrain-{i}-x": f"containerd://{i:064x}" for i in range(4)}
    base = good()
    return base | {
        "real_node": True,
        "real_node_name": "x",
        "image_digest": "sha256:" + "a" * 64,
        "real_node_ranks": ranks,
        "device_plugin": device_plugin(),
        # The device-plugin story's reset and validation on the real node, beside the reset story's.
        "gpus_reset": [{"node": "x", "gpu": 4}, *base["gpus_reset"]],
        "validations": [{"node": "x", "gpu": 4, "result": "Passed"}, *base["validations"]],
    }


def test_a_real_node_run_must_quarantine_the_real_node_whose_ranks_ran_in_containers() -> None:
    assert run.check(real(), "x", "h", "m", "r", 1) == []
    assert run.check(good() | {"real_node": False}, "x", "h", "m", "r", 1) == []  # nothing more without it
    misses = realnode.misses(real() | {"real_node_name": "other", "image_digest": "", "real_node_ranks": {}})
    assert len(misses) == 3
    assert "real node other" in misses[0] and "image digest" in misses[1] and "containerd" in misses[2]
    kwok_ranks = {f"p{i}": "" for i in range(4)}
    assert realnode.misses(real() | {"real_node_ranks": kwok_ranks}) != []


def test_a_real_node_run_must_tell_the_device_plugin_story() -> None:
    assert deviceplugin.misses(real()) == [] and deviceplugin.misses(good()) == []
    assert deviceplugin.misses(real() | {"device_plugin": {}}) == [
        "the device-plugin story did not run on the real node"
    ]
    bad = device_plugin() | {
        "allocatable_withheld": 8,
        "moved_pods": ["ml/dp-a", "ml/dp-b"],
        "kept_pod": {"pod": "ml/dp-b", "same_uid": False, "restarts": 0, "phase": "Running"},
        "node_tainted_or_cordoned": True,
        "reset_jobs": ["r: Failed"],
        "validation_jobs": [],
        "plugin_restarted": False,
        "returned_while_withheld": True,
    }
    misses = deviceplugin.misses(real() | {"device_plugin": bad})
    assert len(misses) == 8, misses
    assert "expected 7" in misses[0] and "only ml/dp-a" in misses[1] and "untouched" in misses[2]
    assert "tainted or cordoned" in misses[3] and "reset Jobs" in misses[4] and "validation Jobs" in misses[5]
    assert "not restarted" in misses[6] and "back only once offered" in misses[7]
    # The reset story's check still wants exactly its own reset beside the real node's.
    extra = real() | {"gpus_reset": [*real()["gpus_reset"], {"node": "h", "gpu": 2}]}
    assert any("succeeded reset Jobs" in m for m in run.check(extra, "x", "h", "m", "r", 1))


def test_the_device_plugin_summary_keys_are_documented() -> None:
    documented = set(re.findall(r"`([a-z_]+)`", DEVELOPMENT.read_text(encoding="utf-8")))
    missing = {"device_plugin", *device_plugin(), *device_plugin()["kept_pod"]} - documented
    assert not missing, f"docs/development.md does not name the demo summary's {sorted(missing)}"


def test_the_real_nodes_policies_split_the_fleet() -> None:
    fleet = deviceplugin.fleet_policy(DEMO_POLICY, "real")
    assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["real"]} in fleet["nodeSelector"][
        "matchExpressions"
    ]
    assert DEMO_POLICY["nodeSelector"]["matchExpressions"] != fleet["nodeSelector"]["matchExpressions"]  # a copy
    own = deviceplugin.policy(DEMO_POLICY, "real", "img:1")
    assert own["nodeSelector"] == {"matchLabels": {"kubernetes.io/hostname": "real"}} and own["mode"] == "Enforce"
    assert own["rules"]["agentSilence"] == {"after": "2m"} and DEMO_POLICY["rules"]["agentSilence"] == {"after": "30s"}
    assert own["actions"]["drain"]["maxWait"] == "5s" and "actions" not in DEMO_POLICY
    (reset,) = own["remediation"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    (diag,) = own["validation"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert reset["image"] == diag["image"] == "img:1" and "${GPU_UUID}" in reset["command"] + diag["command"]


def test_the_fabric_storys_masks_are_what_the_operator_reads_as_healthy_and_as_the_domains_fault() -> None:
    assert api_fabric.decode_health_mask(fabric.HEALTHY_MASK).faults == ()
    assert api_fabric.decode_health_mask(fabric.HEALTHY_MASK).route_unhealthy is False
    sick = api_fabric.decode_health_mask(fabric.ROUTE_UNHEALTHY_MASK)
    assert sick.faults == ("routeUnhealthy",) and sick.degraded_bandwidth is False
    lines = fabric.scenario()
    assert "gpu * fabric_state 3" in lines and f"gpu * fabric_clique {fabric.CLIQUE_ID}" in lines
    assert f"{fabric.CLUSTER_UUID}.{fabric.CLIQUE_ID}" == fabric.DOMAIN  # GFD's <clusterUuid>.<cliqueId>
    assert fabric.fault_lines(sick=True)[0] == f"gpu {fabric.SICK_GPU} fabric_mask {fabric.ROUTE_UNHEALTHY_MASK:#x}"


def test_check_names_each_miss_of_the_fabric_and_rack_stories() -> None:
    partial = good() | {
        "fabric": fabric.fabric_summary(["n0", "n1", "n2"], ["ImexDomain", "Healthy"], 0.8, 5, 4, 6.1, [1.0]),
        "rack": fabric.rack_summary(["n0", "n1", "n2"], 2.0, ["Quarantined"], ["n0"], ["n0"]),
    }
    misses = run.check(partial, "x", "h", "m", "r", 1)
    assert len(misses) == 6, misses
    assert "ImexDomain on every one" in misses[0] and "expected 4" in misses[1] and "5 checkpoint" in misses[2]
    assert "RackPowerBrake" in misses[3] and "tainted ['n0']" in misses[4]
    assert "['n0'] held on their own" in misses[5]


def test_the_fabric_and_rack_summary_keys_are_documented() -> None:
    text = DEVELOPMENT.read_text(encoding="utf-8")
    documented = set(re.findall(r"`([a-z_]+)`", text))
    entry = good()
    for key in ("fabric", "rack"):
        missing = {key, *entry[key]} - documented
        assert not missing, f"docs/development.md does not name the demo summary's {sorted(missing)}"


# -- make demo KUEUE=1 ---------------------------------------------------------------------------------


def kwl(
    *conds: str, state: str = "Ready", message: str = "", retries: int = 0, moves: int = 0, evicted_by: str = ""
) -> dict[str, Any]:
    """A Workload as Kueue writes it: its conditions, gpuhealth's check, and its eviction stats."""
    conditions = [{"type": c, "status": "True", "reason": evicted_by if c == "Evicted" else c} for c in conds]
    check: dict[str, Any] = {"name": kueue.CHECK, "state": state, "message": message}
    if retries:
        check["retryCount"] = retries
    stats = {"evictions": [{"reason": "AdmissionCheck", "underlyingCause": "", "count": moves}]} if moves else {}
    return {
        "metadata": {"name": "job-llm-pretrain-1"},
        "status": {"conditions": conditions, "admissionChecks": [check], "schedulingStats": stats},
    }


def story(*wls: dict[str, Any], why: str = "") -> list[str]:
    out, prev = [], None
    for w in wls:
        cur = kueue.view(w)
        assert cur is not None
        out += kueue.rows(prev, cur, why)
        prev = cur
    return out


def test_the_workloads_move_through_kueue_reads_as_one_row_per_change() -> None:
    ready = "no capacity gpuhealth holds out is assigned"
    moved = "gpuhealth is taking n0 out of service (XID 79 on GPU 3)"
    got = story(
        kwl("QuotaReserved", state="Pending"),
        kwl("QuotaReserved", "Admitted", message=ready),
        kwl("QuotaReserved", "Admitted", message=ready),  # nothing new: no row
        kwl("QuotaReserved", "Admitted", state="Retry", message=moved, retries=1),
        kwl("QuotaReserved", "Admitted", "Evicted", state="Retry", retries=1, moves=1, evicted_by="AdmissionCheck"),
        kwl(state="Pending", retries=1, moves=1),
        kwl("QuotaReserved", state="Pending", retries=1, moves=1),
        kwl("QuotaReserved", "Admitted", message=ready, retries=1, moves=1),
    )
    wl = "Workload ml/job-llm-pretrain-1"
    assert got == [
        f"Kueue: {wl} reserved quota in ClusterQueue {kueue.CLUSTER_QUEUE}; gpuhealth's check Pending",
        f"gpuhealth's admission check on {wl} -> Ready: {ready}",
        f"Kueue: {wl} admitted: the Job starts",
        f"gpuhealth's admission check on {wl} -> Retry: {moved}",
        f"Kueue: evicted {wl} (reason AdmissionCheck): the Job suspended, its quota released, requeued",
        f"Kueue: {wl} reserved quota again in ClusterQueue {kueue.CLUSTER_QUEUE}; gpuhealth's check Pending",
        f"gpuhealth's admission check on {wl} -> Ready: {ready}",
        f"Kueue: {wl} admitted again after 1 move(s): the Job resumes, its ranks start from their checkpoint "
        "off the failed node",
    ]


def test_a_retry_and_eviction_kueue_finished_between_two_polls_still_get_their_rows() -> None:
    got = story(
        kwl("QuotaReserved", "Admitted", message="ok"),
        kwl(state="Pending", retries=1, moves=1),  # Retry written, acted on and reset within one poll
        why="gpuhealth is taking n0 out of service",
    )
    assert got[-2].endswith("-> Retry: gpuhealth is taking n0 out of service")
    assert "evicted Workload ml/job-llm-pretrain-1 (reason AdmissionCheck)" in got[-1]


def test_the_summarys_kueue_fields_come_from_the_workload_and_are_checked() -> None:
    wl = kwl("QuotaReserved", "Admitted", retries=1, moves=1)
    fields = kueue.summary_fields(wl, moved_events=1, ranks_evicted=0)
    assert fields == {
        "kueue": True,
        "workload": "ml/job-llm-pretrain-1",
        "workload_moves": 1,
        "workload_readmitted": True,
        "workload_check_retries": 1,
        "workload_moved_events": 1,
        "training_ranks_evicted_by_gpuhealth": 0,
    }
    assert run.check(good() | fields, "x", "h", "m", "r", 1) == []
    assert run.check(good() | {"kueue": False}, "x", "h", "m", "r", 1) == []
    # Still evicted, never moved, or moved by evicting pods: each named.
    stuck = kueue.summary_fields(kwl("Evicted", state="Pending", retries=1, moves=1), 1, 0)
    assert not stuck["workload_readmitted"]
    assert kueue.misses(stuck) == ["the Workload was not admitted again (with gpuhealth's check Ready) after its move"]
    never = kueue.summary_fields(kwl("QuotaReserved", "Admitted"), 0, 4)
    assert len(kueue.misses(never)) == 4 and "evicted 4 training ranks itself" in kueue.misses(never)[-1]
    assert kueue.summary_fields(None, 0, 0)["workload"] is None


def test_the_demo_queue_uses_gpuhealths_check_for_the_gpu_nodes() -> None:
    flavor, check, cq, lq = kueue.queue_objects({"nvidia.com/gpu.present": "true"})
    assert check["spec"]["controllerName"] == "gpuhealth.dev/healthy-capacity"
    assert cq["spec"]["admissionChecksStrategy"]["admissionChecks"] == [{"name": check["metadata"]["name"]}]
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["name"] == flavor["metadata"]["name"]
    assert lq["spec"]["clusterQueue"] == cq["metadata"]["name"] and lq["metadata"]["namespace"] == "ml"
    job = kueue.queued({"metadata": {"name": "j"}, "spec": {}})
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": lq["metadata"]["name"]}
    assert job["spec"]["suspend"] is True
