"""The reset Job templates the remediation tests, chaos and the real-node tier give a policy's ladder.

KWOK runs its pod through the stage in ``devkit/kwok/pod-remediation.yaml``: the "reset"
completes, or exits 1 when the pod carries ``gpuhealth-test/outcome=fail``. The command and the
variables are docs/policy.md's example reset Job, so the operator's substitution of ``${NODE_NAME}``
and ``${GPU_UUID}`` is checked on the pods it creates.
"""

from __future__ import annotations

import json
from typing import Any

OUTCOME_LABEL = "gpuhealth-test/outcome"


def reset_job_template(fail: bool = False, image: str = "example.invalid/reset:test") -> dict[str, Any]:
    """A ``spec.remediation.jobTemplate`` whose reset KWOK completes, or fails when ``fail``."""
    labels = {OUTCOME_LABEL: "fail"} if fail else {}
    return {
        "spec": {
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": "${NODE_NAME}",
                    "containers": [
                        {
                            "name": "reset",
                            "image": image,
                            "command": ["nvidia-smi", "-r", "-i", "${GPU_UUID}"],
                            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "${GPU_UUID}"}],
                        }
                    ],
                },
            }
        }
    }


# The real node's stand-in for ``nvidia-smi -r -i <UUID>`` (devkit/realnode.py): in gpuhealth's own
# image, under the RuntimeClass ``nvidia`` that mounts the fake NVML where the toolkit mounts the
# driver's, it finds the GPU by its UUID through NVML and exits 0, or 1 when NVML does not show it.
NVML_RESET = """\
import sys
import pynvml as nvml
nvml.nvmlInit()
want = sys.argv[1]
for i in range(nvml.nvmlDeviceGetCount()):
    uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
    if (uuid.decode() if isinstance(uuid, bytes) else uuid) == want:
        print(f"GPU {i} {want}: reset (a stand-in for nvidia-smi -r)")
        sys.exit(0)
sys.exit(f"GPU {want} not visible through NVML")
"""


def nvml_reset_job_template(image: str, runtime_class: str) -> dict[str, Any]:
    """A ``spec.remediation.jobTemplate`` whose pod runs :data:`NVML_RESET` in ``image`` (pull policy
    Never: it is on the node already) on a real node, with the GPU's UUID as NVIDIA's toolkit reads it."""
    return {
        "spec": {
            "template": {
                "spec": {
                    "nodeName": "${NODE_NAME}",
                    "runtimeClassName": runtime_class,
                    "containers": [
                        {
                            "name": "reset",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["python", "-c", NVML_RESET, "${GPU_UUID}"],
                            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "${GPU_UUID}"}],
                        }
                    ],
                },
            }
        }
    }


# The real node's stand-in for DCGM's diagnostic of one GPU: it finds the GPU by its UUID through NVML,
# as NVML_RESET does, and writes ``dcgmi diag --json``'s pass for that GPU's index (the JSON in argv[2],
# its entities renumbered) to its termination message, where gpuhealth reads a validation's verdict.
NVML_DIAG = """\
import json, sys
import pynvml as nvml
nvml.nvmlInit()
want, diag = sys.argv[1], json.loads(sys.argv[2])
for i in range(nvml.nvmlDeviceGetCount()):
    uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
    if (uuid.decode() if isinstance(uuid, bytes) else uuid) == want:
        for category in diag["DCGM Diagnostic"]["test_categories"]:
            for test in category["tests"]:
                for result in test["results"]:
                    result["entity_id"] = i
        with open("/dev/termination-log", "w") as f:
            json.dump(diag, f)
        print(f"GPU {i} {want}: diagnostic passed (a stand-in for dcgmi diag)")
        sys.exit(0)
sys.exit(f"GPU {want} not visible through NVML")
"""


def nvml_validation_job_template(image: str, runtime_class: str) -> dict[str, Any]:
    """A ``spec.validation.jobTemplate`` whose pod runs :data:`NVML_DIAG` in ``image`` on a real node: a
    DCGM pass of the GPU it finds by ``${GPU_UUID}``, in its termination message."""
    template = nvml_reset_job_template(image, runtime_class)
    (container,) = template["spec"]["template"]["spec"]["containers"]
    container.update(
        name="diag",
        command=["python", "-c", NVML_DIAG, "${GPU_UUID}", dcgm_diag_json(0)],
        terminationMessagePath="/dev/termination-log",
    )
    return template


MESSAGE_ANNOTATION = "gpuhealth-test/termination-message"


def dcgm_diag_json(gpu: int, fail: bool = False) -> str:
    """What ``dcgmi diag -r 2 -i <gpu> --json`` prints (DCGM 4.x key names, NVIDIA/DCGM
    ``nvvs/include/NvvsJsonStrings.h``): a pass, or the PCIe test failing on that GPU."""

    def result(status: str, warning: str = "", error_id: int = 0) -> dict[str, Any]:
        r: dict[str, Any] = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": status}
        if warning:
            r["warnings"] = [{"warning": warning, "error_id": error_id, "error_category": 4, "error_severity": 2}]
        return r

    pcie = result("Fail", f"GPU {gpu} PCIe link width x8, expected x16", 46) if fail else result("Pass")
    return json.dumps(
        {
            "DCGM Diagnostic": {
                "test_categories": [
                    {"category": "Deployment", "tests": [{"name": "software", "results": [result("Pass")]}]},
                    {"category": "Integration", "tests": [{"name": "pcie", "results": [pcie]}]},
                    {"category": "Hardware", "tests": [{"name": "memory", "results": [result("Pass")]}]},
                ]
            },
            "version": "4.6.0",
            "Overall Result": "Fail" if fail else "Pass",
        }
    )


HOLD = "hold"  # a pod with this outcome matches no KWOK stage: it runs until the test removes the label


def validation_job_template(
    gpu: int, fail: bool = False, image: str = "example.invalid/dcgm:test", hold: bool = False
) -> dict[str, Any]:
    """A ``spec.validation.jobTemplate`` whose pod KWOK ends with ``dcgm_diag_json`` as its termination
    message (``devkit/kwok/pod-validation.yaml``), exiting 1 when ``fail``; with ``hold`` its pod
    runs until the test removes its ``gpuhealth-test/outcome`` label (then it passes). Its command is
    the default Job's shape, so the operator's substitution of ``${GPU_INDEX}`` and
    ``${VALIDATION_LEVEL}`` is checked on the pods it creates."""
    labels = {OUTCOME_LABEL: "fail"} if fail else {OUTCOME_LABEL: HOLD} if hold else {}
    return {
        "spec": {
            "template": {
                "metadata": {"labels": labels, "annotations": {MESSAGE_ANNOTATION: dcgm_diag_json(gpu, fail)}},
                "spec": {
                    "nodeName": "${NODE_NAME}",
                    "containers": [
                        {
                            "name": "dcgm-diag",
                            "image": image,
                            "command": ["dcgmi", "diag", "-r", "${VALIDATION_LEVEL}", "-i", "${GPU_INDEX}", "--json"],
                        }
                    ],
                },
            }
        }
    }
