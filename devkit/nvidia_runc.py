#!/usr/bin/env python3
"""The real node's ``nvidia`` runtime: runc, plus the fake NVML library where NVIDIA's toolkit puts it.

containerd runs this (through the per-run wrapper script devkit/realnode.py writes, which names the
library, the scenario directory and the real runc) as the ``BinaryName`` of its ``nvidia`` runtime
handler, the one the RuntimeClass ``nvidia`` selects. Like the legacy nvidia-container-runtime, on
``create`` of a container whose environment has ``NVIDIA_VISIBLE_DEVICES`` it edits the bundle's
OCI config before handing over to runc: a read-only bind mount of the library at
``/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`` (where the toolkit mounts the host driver's copy),
plus, because the library is the fake, its scenario directory (read-only) and a writable directory
for its delivery log, with the two variables that point the library at them. Every other call and
every other container goes to runc unchanged.

Standard library only: the host's python3 runs it, outside any virtualenv.
"""

from __future__ import annotations

import json
import os
import sys

LIB_TARGET = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
SCENARIO_TARGET = "/run/gpuhealth-fake-nvml/scenario"
EMIT_TARGET = "/run/gpuhealth-fake-nvml/out"


def bundle_of(args: list[str]) -> str:
    for i, a in enumerate(args):
        if a in ("--bundle", "-b") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--bundle="):
            return a.split("=", 1)[1]
    return os.getcwd()


def inject(config: dict[str, object], lib: str, scenario_dir: str, emit_dir: str) -> bool:
    """Add the mounts and variables to an OCI config whose process asks for GPUs; True if it did."""
    process = config.get("process")
    if not isinstance(process, dict):
        return False
    env = [str(e) for e in process.get("env") or []]
    if not any(e.startswith("NVIDIA_VISIBLE_DEVICES=") and e.split("=", 1)[1] not in ("", "void") for e in env):
        return False
    mounts = config.setdefault("mounts", [])
    assert isinstance(mounts, list)
    mounts += [
        {"destination": LIB_TARGET, "type": "bind", "source": lib, "options": ["rbind", "ro", "nosuid", "nodev"]},
        {"destination": SCENARIO_TARGET, "type": "bind", "source": scenario_dir, "options": ["rbind", "ro"]},
        {"destination": EMIT_TARGET, "type": "bind", "source": emit_dir, "options": ["rbind", "rw"]},
    ]
    process["env"] = [
        *env,
        f"FAKE_NVML_SCENARIO={SCENARIO_TARGET}/scenario",
        f"FAKE_NVML_EMIT_LOG={EMIT_TARGET}/emitted",
    ]
    return True


def main(argv: list[str]) -> int:
    # argv: --runc PATH --lib PATH --scenario-dir DIR --emit-dir DIR -- <runc's own arguments>
    sep = argv.index("--")
    opts = dict(zip(argv[:sep:2], argv[1:sep:2], strict=True))
    args = argv[sep + 1 :]
    if "create" in args:
        path = os.path.join(bundle_of(args), "config.json")
        with open(path) as f:
            config = json.load(f)
        if inject(config, opts["--lib"], opts["--scenario-dir"], opts["--emit-dir"]):
            tmp = path + ".gpuhealth"
            with open(tmp, "w") as f:
                json.dump(config, f)
            os.replace(tmp, path)
    runc = opts["--runc"]
    os.execv(runc, [runc, *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
