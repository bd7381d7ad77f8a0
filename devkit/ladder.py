"""The reset Job template the remediation tests and chaos give a policy's ladder.

KWOK runs its pod through the stage in ``devkit/kwok/pod-remediation.yaml``: the "reset"
completes, or exits 1 when the pod carries ``gpuhealth-test/outcome=fail``. The command and the
variables are docs/policy.md's example reset Job, so the operator's substitution of ``${NODE_NAME}``
and ``${GPU_UUID}`` is checked on the pods it creates.
"""

from __future__ import annotations

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
