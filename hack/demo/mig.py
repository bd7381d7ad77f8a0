"""The MIG story (issue #23): a DRA inference node whose 8 GPUs are all partitioned with static MIG
(two 3g.40gb devices each, published as NVIDIA's DRA driver publishes them), 16 inference pods, one
per MIG device, and the node's real agent reporting the same MIG layout (the same MIG UUIDs) from
the fake NVML. A failed row remap on one GPU, a fault no reset clears (no repair ladder: it waits
for a human), holds out that GPU's two MIG devices only; their pods checkpoint and move (the
replacements stay Pending: every other partition is busy), the other 14 partitions keep serving.
"""

from __future__ import annotations

import time
from typing import Any

from devkit import dra
from devkit import dra_shapes as S
from devkit.agents import Agent
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, wait_for
from hack.demo.common import (
    NS,
    Timeline,
    allocated,
    claim_deployment,
    devices_of,
    gpuhealth_rules,
    pods_of,
    running,
    slice_devices,
)

APP = "mig-serving"
GPUS = 8
LAYOUT = (("3g.40gb", 0), ("3g.40gb", 4))  # (profile, placement start) of each GPU's two MIG devices
BAD_GPU = 5


def gpus(node: str) -> list[S.Gpu]:
    return [S.Gpu(i, dra.node_uuid(node, i), LAYOUT) for i in range(GPUS)]


def scenario(node: str) -> list[str]:
    """The fake NVML lines of the node: its own GPU UUIDs, MIG mode on, the same MIG devices (and
    MIG UUIDs) the slices publish. NVML numbers the GPU instances 1 and 2, compute instance 0."""
    lines = []
    for g in gpus(node):
        lines += [f"gpu {g.minor} uuid {g.uuid}", f"gpu {g.minor} mig 1"]
        for slot, (profile, start) in enumerate(g.mig):
            lines.append(f"gpu {g.minor} mig_device {slot} {slot + 1} 0 {profile} {S.mig_uuid(g.uuid, profile, start)}")
    return lines


def configure_agent(agent: Agent) -> None:
    agent.lines += scenario(agent.node)
    agent.write()


def device_names(gpu: int) -> list[str]:
    """The MIG devices of ``gpu`` as the current driver names them (``gpu-5-mig-3g40gb-9-0``)."""
    return [S.mig_name(gpu, profile, start, "current") for profile, start in LAYOUT]


def gpu_of(device: str) -> int:
    return int(device.split("-")[1])  # gpu-<minor>-mig-...


def setup(cluster: LocalCluster, kube: Kube, node: str, timeline: Timeline) -> dict[str, list[str]]:
    """Publish the slices, run the pods; returns pod -> its MIG devices."""

    def reported() -> dict[str, str] | None:
        devs = (kube.report(node).get("spec") or {}).get("devices") or []
        migs = {m["uuid"]: d["uuid"] for d in devs for m in d.get("migDevices") or [] if m.get("uuid")}
        return migs if len(migs) == GPUS * len(LAYOUT) else None

    agent_migs = wait_for(reported, timeout=30, what=f"{node}'s agent reporting 16 MIG devices")
    published = S.static_slices(node, gpus(node))
    slice_migs = {
        d["attributes"]["uuid"]["string"]: d["attributes"]["parentUUID"]["string"]
        for s in published.slices
        for d in s["spec"]["devices"]
    }
    assert agent_migs == slice_migs, (
        f"the agent's MIG devices {sorted(agent_migs)} are not the slices' {sorted(slice_migs)} (MIG UUID -> GPU UUID)"
    )
    dra.publish(kube, published)
    cluster.apply_objects(
        [dra.claim_template(NS, "mig", 1, cel=dra.MIG_CEL), claim_deployment(APP, "mig", node, GPUS * len(LAYOUT))]
    )
    wait_for(lambda: len(running(kube, APP)) == GPUS * len(LAYOUT), timeout=120, what="16 MIG serving pods running")
    held = wait_for(
        lambda: (
            (h := {p.metadata.name: allocated(kube, p) for p in running(kube, APP)})
            and all(h.values())
            and len(h) == GPUS * len(LAYOUT)
            and h
        ),
        timeout=30,
        what="every MIG pod's claim allocated",
    )
    on_gpus = {gpu_of(d) for devs in held.values() for d in devs}
    assert on_gpus == set(range(GPUS)), f"MIG pods on GPUs {sorted(on_gpus)}, not on partitions of every GPU"
    timeline.add(
        f"{node}: MIG inference node; all {GPUS} GPUs in MIG mode (2x 3g.40gb each, agent and slices agree on "
        f"the 16 MIG UUIDs); {len(held)} pods, one MIG device each, on partitions of every GPU"
    )
    return held


def inject(agent: Agent, timeline: Timeline) -> float:
    at = time.time()
    agent.set(f"gpu {BAD_GPU} remap_failure 1")
    timeline.add(
        f"{agent.node}: fault injected: GPU {BAD_GPU} row remapping failed (no reset clears it; no ladder)", at
    )
    return at


def verify(kube: Kube, node: str, held: dict[str, list[str]], timeline: Timeline) -> dict[str, Any]:
    """The GPU's MIG devices held out, exactly; their pods moved; the other partitions serve on."""
    bad_devs = sorted(d for devs in held.values() for d in devs if gpu_of(d) == BAD_GPU)
    want = {f"gpuhealth-{node}-{d}": d for d in device_names(BAD_GPU)}

    def ours() -> dict[str, str]:
        return {
            r["metadata"]["name"]: r["spec"]["deviceSelector"]["device"]
            for r in gpuhealth_rules(kube)
            if r["spec"]["deviceSelector"].get("pool") == node
        }

    wait_for(lambda: ours() == want, timeout=60, what=f"one DeviceTaintRule per MIG device of GPU {BAD_GPU} only")
    assert sorted(want.values()) == bad_devs, f"rules {sorted(want.values())} vs the pods' devices {bad_devs}"
    moving = sorted(p for p, devs in held.items() if any(gpu_of(d) == BAD_GPU for d in devs))
    staying = sorted(set(held) - set(moving))
    wait_for(
        lambda: not {p.metadata.name for p in pods_of(kube, APP)} & set(moving),
        timeout=60,
        what=f"the pods on GPU {BAD_GPU}'s partitions ({', '.join(moving)}) checkpointed and evicted",
    )
    wait_for(
        lambda: devices_of(kube, node).get(BAD_GPU, {}).get("state") == "AwaitingRepair",
        timeout=30,
        what=f"GPU {BAD_GPU} drained and waiting for a human repair",
    )
    new = wait_for(
        lambda: (
            (n := [p.metadata.name for p in pods_of(kube, APP) if p.metadata.name not in held]) and len(n) == 2 and n
        ),
        timeout=30,
        what="two replacement MIG pods",
    )
    for pod in new:
        dra.wait_unschedulable(kube, NS, pod)
    serving = {p.metadata.name for p in running(kube, APP)}
    assert serving == set(staying), f"the other partitions' pods should serve on: {sorted(set(staying) - serving)}"
    assert kube.our_taint(node) is None, f"{node} must not be tainted: only GPU {BAD_GPU}'s partitions go"
    timeline.add(
        f"{node}: {', '.join(moving)} (on GPU {BAD_GPU}'s partitions) checkpointed and were evicted; their "
        f"replacements stay Pending (the scheduler will not allocate the tainted MIG devices, every other "
        f"partition is busy); {len(serving)} pods serve on the other 7 GPUs' partitions"
    )
    return {"mig_pods_moved": len(moving), "mig_pods_serving": len(serving), "mig_pods_pending": len(new)}


def partitions(kube: Kube) -> tuple[list[dict[str, Any]], int]:
    """From the cluster: gpuhealth's DeviceTaintRules that select MIG devices, and the count of MIG
    devices in the slices that no gpuhealth rule selects."""
    migs = {(pool, name) for pool, name, kind in slice_devices(kube) if kind == "mig"}
    held = []
    for r in gpuhealth_rules(kube):
        sel = r["spec"]["deviceSelector"]
        if (sel.get("pool"), sel.get("device")) in migs:
            held.append({"node": sel["pool"], "device": sel["device"], "rule": r["metadata"]["name"]})
    held.sort(key=lambda h: (h["node"], h["device"]))
    return held, len(migs - {(h["node"], h["device"]) for h in held})
