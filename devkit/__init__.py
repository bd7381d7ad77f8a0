"""gpuhealth's development kit: what `hack/` (demo, bench, chaos) and `tests/` both use.

The local control plane and its KWOK stages, the Kube helpers and the operator/agent processes,
the fake NVML library, DRA publishing, the audit reader, the chart and manifest renderers. It
imports only the product (`gpuhealth`) and third-party packages; `hack/` and `tests/` import it and
never each other (`tests/unit/test_layers.py` holds all three to that).
"""
