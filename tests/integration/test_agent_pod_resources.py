"""The installed agent reads the real kubelet's pod-resources socket: which pods hold each GPU.

On the real node (devkit/realnode.py) gpuhealth is installed with ``agent.podResources.enabled`` (the
namespace labelled Pod Security "privileged", as docs/install.md says it must be for the hostPath).
The kubelet's socket is root's alone (0755 in a 0750 directory), so the agent container runs as uid 0
with no capability: the agent's process on the host is checked to be exactly that, and its report says
``podResources.available: true`` with no GPU held (no device plugin runs here, so no pod holds one).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devkit.k8s import GROUP, VERSION, Kube, wait_for
from devkit.realnode import Installed, RealNode


@dataclass
class Env:
    installed: Installed
    node: RealNode
    kube: Kube


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    installed = Installed.start(tmp_path_factory.mktemp("pod-resources"), name="real-gpu-node")
    try:
        installed.install(None, pod_resources=True)
        yield Env(installed, installed.node, Kube(installed.cluster.kubeconfig))
    finally:
        installed.stop()


def report(e: Env) -> dict[str, Any]:
    obj: dict[str, Any] = e.kube.custom.get_cluster_custom_object(GROUP, VERSION, "gpunodehealths", e.node.name)
    return obj


def _proc_status(pid: str) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def agent_processes(e: Env) -> list[dict[str, str]]:
    """``/proc/<pid>/status`` of each ``gpuhealth-agent`` process running in one of the node's pods."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes()
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue
        if b"gpuhealth-agent" in cmdline and "kubepods" in cgroup:
            try:
                out.append(_proc_status(proc.name))
            except OSError:
                continue
    return out


def test_the_kubelet_s_socket_is_root_s_alone(env: Env) -> None:
    """Why the agent container runs as uid 0 (docs/agent.md, "Privileges"): the kubelet makes the
    directory 0750 and the socket 0755, both root's; connecting needs write permission on it."""
    d = env.node.pod_resources_dir
    sock = d / "kubelet.sock"
    wait_for(sock.exists, timeout=60, what="the kubelet's pod-resources socket")
    dir_st, sock_st = os.stat(d), os.stat(sock)
    assert stat.S_ISSOCK(sock_st.st_mode)
    assert (dir_st.st_uid, dir_st.st_gid, stat.S_IMODE(dir_st.st_mode)) == (0, 0, 0o750)
    assert (sock_st.st_uid, stat.S_IMODE(sock_st.st_mode) & 0o022) == (0, 0), "the socket is writable by others"


def test_the_installed_agent_reads_the_socket_as_root_without_capabilities(env: Env) -> None:
    spec = wait_for(
        lambda: (report(env).get("spec") or {}).get("podResources") and report(env)["spec"],
        timeout=120,
        what="the agent's report with podResources",
    )
    assert spec["podResources"] == {"available": True}, spec["podResources"]
    assert len(spec["devices"]) == 8
    assert not [d["index"] for d in spec["devices"] if d.get("pods")], "a GPU is held before any pod asked for one"
    (proc,) = wait_for(lambda: agent_processes(env), timeout=30, what="the agent's process")
    # uid 0, every capability dropped: it connects as the socket's owner, never by CAP_DAC_OVERRIDE.
    assert proc["Uid"].split()[0] == "0", proc["Uid"]
    assert int(proc["CapEff"], 16) == 0 and int(proc["CapPrm"], 16) == 0 and int(proc["CapBnd"], 16) == 0
    assert proc["NoNewPrivs"] == "1"
