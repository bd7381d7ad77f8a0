"""What a real node (devkit/realnode.py) changes on the host: recorded before, undone from the record.

The node's processes are started by pid and the host's state is shared by everything on the
machine, so the record lives at a fixed place, ``/run/gpuhealth-realnode/state.json``, written
before the first change. :func:`teardown` undoes exactly what it names and what is still there:
the kubelet, every container (through the run's own containerd), containerd and any process that
names the run's containerd socket (the shims), the ``kubepods`` cgroups, the mounts under the
run's directory, the pods' network namespaces, the bridge, the nft table, the sysctls the kubelet
and the bridge plugin write, the host directories containerd and libcni create, and (for a killed
run) the control plane the node joined. It runs on the node's stop, on the next start, and in
``make cluster-down`` (hack/cluster.py). Every step is safe to repeat.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from devkit import pidfile

STATE_DIR = Path("/run/gpuhealth-realnode")
STATE = STATE_DIR / "state.json"
LOCK = STATE_DIR / "lock"
BRIDGE = "gh-realnode0"
NFT_TABLE = "gpuhealth_realnode"
# What the kubelet writes under /proc/sys when protectKernelDefaults is off, and what the bridge
# plugin (isGateway) switches on.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Host directories containerd, the CNI plugins and the kubelet create (network namespaces, libcni's
# result cache, and the kubelet's device-plugins directory with its registration socket: a path of its
# own, not under its --root-dir).
HOST_DIRS = ("/run/netns", "/var/lib/cni", "/var/lib/kubelet")


def _read_sysctl(key: str) -> str | None:
    try:
        return (Path("/proc/sys") / key).read_text().strip()
    except OSError:
        return None


def _write_sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):
        (Path("/proc/sys") / key).write_text(value + "\n")


def _cgroup_hierarchies() -> list[Path]:
    return sorted(p for p in CGROUP_ROOT.iterdir() if p.is_dir() and (p / "cgroup.procs").exists())


def _netns() -> set[str]:
    d = Path("/run/netns")
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def nft_table_exists() -> bool:
    return subprocess.run(["nft", "list", "table", "ip", NFT_TABLE], capture_output=True).returncode == 0


def _mounts_under(root: Path) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == str(root) or point.startswith(str(root) + "/"):
            out.append(point)
    return out


def _procs_using(needle: str) -> list[int]:
    """Processes whose command line names ``needle`` (the run's own containerd socket)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle.encode() in (d / "cmdline").read_bytes():
                found.append(int(d.name))
        except OSError:
            continue
    return found


def _kill_and_wait(pids: list[int], timeout: float = 10.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pidfile._alive(p) for p in pids):
        time.sleep(0.05)


def _cgroup_procs(top: Path) -> list[int]:
    pids: list[int] = []
    for procs in top.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(x) for x in procs.read_text().split()]
    return pids


def _rmdir_tree(top: Path) -> None:
    dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for d in [*dirs, top]:
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def record_host() -> dict[str, Any]:
    """What the host looks like before the node starts (what teardown restores)."""
    return {
        "sysctls": {k: v for k in SYSCTLS if (v := _read_sysctl(k)) is not None},
        "bridge_existed": link_exists(BRIDGE),
        "nft_existed": nft_table_exists(),
        "netns": sorted(_netns()),
        "kubepods_existed": sorted(str(h) for h in _cgroup_hierarchies() if (h / "kubepods").exists()),
        "run_containerd_existed": Path("/run/containerd").exists(),
        "dirs_existed": sorted(d for d in HOST_DIRS if Path(d).exists()),
    }


def teardown(state_path: Path = STATE, control_plane: bool = True) -> list[str]:
    """Undo everything a real node recorded in ``state_path``; returns what was undone.

    ``control_plane``: also stop the control plane the node joined (by its recorded pids), as for a
    run that was killed; a node stopped by its own test leaves that to the test.

    Safe to run twice, and after a run that was killed at any line: every step acts only on what
    the record names and what is still there.
    """
    if not state_path.exists():
        return []
    state: dict[str, Any] = json.loads(state_path.read_text())
    done: list[str] = []
    workdir = Path(state["workdir"])
    sock = state.get("containerd_socket", "")
    ctr = state.get("ctr", "")
    # 1. The kubelet first (it would restart what is killed), then every container, while
    #    containerd still answers; then containerd; then anything its socket still names (shims).
    kubelet = pidfile.stop_recorded(workdir / "kubelet-pids") if (workdir / "kubelet-pids").exists() else []
    done += [f"stopped {n} (pid {p})" for n, p in kubelet]
    if sock and ctr and Path(sock).exists():
        base = [ctr, f"--address={sock}", "--namespace=k8s.io"]
        tasks = subprocess.run([*base, "tasks", "ls", "-q"], capture_output=True, text=True, timeout=30)
        for cid in tasks.stdout.split():
            subprocess.run([*base, "tasks", "kill", "--all", "--signal=SIGKILL", cid], capture_output=True, timeout=30)
        for cid in tasks.stdout.split():
            for _ in range(50):
                if (
                    subprocess.run(
                        [*base, "tasks", "delete", "--force", cid], capture_output=True, timeout=30
                    ).returncode
                    == 0
                ):
                    break
                time.sleep(0.1)
        if tasks.stdout.split():
            done.append(f"killed {len(tasks.stdout.split())} containers")
    stopped = pidfile.stop_recorded(workdir / "containerd-pids") if (workdir / "containerd-pids").exists() else []
    done += [f"stopped {n} (pid {p})" for n, p in stopped]
    if sock:
        leftovers = _procs_using(sock)
        if leftovers:
            _kill_and_wait(leftovers)
            done.append(f"killed {len(leftovers)} shims")
    # 2. cgroups the node created (with anything still in them, which can only be a container of its own).
    existed = set(state["host"]["kubepods_existed"])
    for h in _cgroup_hierarchies():
        top = h / "kubepods"
        if top.exists() and str(h) not in existed:
            _kill_and_wait(_cgroup_procs(top))
            _rmdir_tree(top)
            done.append(f"removed cgroup {top}")
    # 3. Mounts under the run's directory (the kubelet's volumes, containerd's rootfs and shm).
    for point in sorted(_mounts_under(workdir), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True)
    # 4. Network: the pods' namespaces, the bridge, the nft table.
    for ns in sorted(_netns() - set(state["host"]["netns"])):
        if ns.startswith("cni-"):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
            done.append(f"deleted netns {ns}")
    if not state["host"]["bridge_existed"] and link_exists(BRIDGE):
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
        done.append(f"deleted bridge {BRIDGE}")
    if not state["host"]["nft_existed"] and nft_table_exists():
        subprocess.run(["nft", "delete", "table", "ip", NFT_TABLE], capture_output=True)
        done.append(f"deleted nft table ip {NFT_TABLE}")
    # 5. sysctls back to what they were.
    for key, value in state["host"]["sysctls"].items():
        if _read_sysctl(key) != value:
            _write_sysctl(key, value)
            done.append(f"restored {key.replace('/', '.')}={value}")
    # 6. The control plane the node joined (its API server listens on the node's address).
    if control_plane and (cluster := state.get("cluster_workdir")):
        done += [f"stopped {n} (pid {p})" for n, p in pidfile.stop_recorded(Path(cluster))]
    if not state["host"]["run_containerd_existed"]:
        shutil.rmtree("/run/containerd", ignore_errors=True)
    for d in HOST_DIRS:
        if d not in state["host"].get("dirs_existed", HOST_DIRS) and Path(d).exists():
            # The namespaces' directory only once empty (a mount point in it is not a file to remove).
            if d == "/run/netns":
                with contextlib.suppress(OSError):
                    Path(d).rmdir()
            else:
                shutil.rmtree(d, ignore_errors=True)
            done.append(f"removed {d}")
    state_path.unlink()
    return done
