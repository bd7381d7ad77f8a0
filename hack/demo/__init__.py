"""`make demo`: gpuhealth end to end on a local control plane with 8 fake GPU nodes.

Real agents (one per node, reading a fake NVML library) report to the real API server; the real
operator decides and acts, under a policy with the repair ladder enabled (``spec.remediation``).
Faults are injected into the fake NVML:

- an XID 79 on the training node: the whole node goes (taint, cordon, the ranks checkpoint and
  run again on healthy nodes);
- a sustained thermal slowdown on GPU 2 of a DRA node: only that GPU goes (a DeviceTaintRule; only
  the pod holding it checkpoints and moves; the real scheduler keeps its replacement off GPU 2);
- an application XID that must be ignored;
- MIG (``mig.py``, issue #23): on a DRA inference node whose 8 GPUs are all partitioned with static
  MIG (16 MIG devices, the agent and the slices agreeing on their UUIDs), a failed row remap on
  one GPU, which no reset clears: only that GPU's 2 MIG devices are held out (one DeviceTaintRule
  each), their pods checkpoint and move (the replacements stay Pending), the other 14 partitions
  serve on;
- a GPU back by itself (``reset.py``, issue #24): an uncorrected ECC error on a full DRA GPU: rule,
  drain, a reset Job (KWOK completes its pod), the demo rewrites the GPU's counters clean as
  ``nvidia-smi -r`` would, probation, the rule deleted, the GPU back in service;
- the fabric between GPUs (``fabric.py``, issue #35): 4 more nodes labelled as one NVLink clique
  (and one rack) under a policy of their own, a gang spanning them; a fabric health mask with
  ROUTE_UNHEALTHY = 1 on one GPU of one node takes every node of the clique out as one decision,
  the gang checkpoints once, the domain returns together when the mask heals; then a power brake
  on 3 nodes of the rack is one rack finding, no node repair.

With ``--real-node`` (``make demo REAL_NODE=1``, ``realnode.py``) the XID 79 story runs on a real
kubelet node through the installed chart: the chart's operator Pod is the demo's operator and the
training ranks run in real containers there. NVIDIA's device plugin serves that node's GPUs, and the
device-plugin story (``deviceplugin.py``, issue #50) runs there first: an XID 48 on one pod's GPU, the
plugin withholds it (allocatable 7), only that pod moves, the pod on another GPU keeps running, reset
Job -> validation -> plugin restarted -> allocatable 8.

Prints a timeline, `kubectl get gpuhealth`, `kubectl get gpunodes` and the Node events, and writes
build/demo/summary.json (read from the cluster); exits 1, naming what is missing, unless every story
happened. `--keep` leaves everything running for exploring.

Modules: ``run`` (the driver and the summary), ``common`` (policy, timeline, Node watch, the pods'
checkpoint sidecar), ``workloads`` (the training job, inference and DRA serving pods),
``devicewatch`` (timeline rows from DeviceTaintRules, GPU records, ladders and reset Jobs), ``mig``,
``reset`` and ``fabric`` (one story each), ``realnode`` (the first story on a real node),
``deviceplugin`` (the device-plugin story on the real node).
"""
