"""`make demo`: gpuhealth end to end on a local control plane with 8 fake GPU nodes.

Real agents (one per node, reading a fake NVML library) report to the real API server; the real
operator decides and acts. Faults are injected into the fake NVML: an XID 79 on one node (the whole
node goes), a sustained thermal slowdown on GPU 2 of a DRA node (only that GPU goes: a
DeviceTaintRule, and only the pod holding it checkpoints and moves; the real scheduler keeps its
replacement off GPU 2), and an application XID that must be ignored.
Prints a timeline, `kubectl get gpuhealth`, `kubectl get gpunodes` and the Node events, and writes
build/demo/summary.json; exits 1, naming what is missing, unless every story happened. `--keep`
leaves everything running for exploring.

Modules: ``run`` (the driver and the summary), ``common`` (policy, timeline, Node watch, the pods'
checkpoint sidecar), ``workloads`` (the training job, inference and DRA serving pods).
"""
