"""`make bench`: gpuhealth's performance on a fleet of fake GPU nodes (default 1,000) on a real control plane.

Measures, in one run (see docs/bench.md):

1. operator start-up: process start to "watching N GPU nodes", and to every node Healthy;
2. detection to taint: an XID 79 published by the agent's own publishing code on one node at a time, until an
   independent Node watch sees the gpuhealth taint; against a floor, a no-logic watch-and-patch chain;
3. a storm of simultaneous faults with the breaker at 100% (nodes per second), then the breaker at 5%
   (half the storm where 5% is not below it);
4. on nodes whose GPUs are published through DRA: an uncorrected ECC error on one GPU at a time until an
   independent watch sees its DeviceTaintRule, and a device storm (GPUs on distinct nodes at once); with
   ``--phases mig``, the same on a MIG fleet (7 MIG devices per GPU) to the GPU's last rule (hack/bench/mig.py);
5. the operator's footprint (peak RSS, CPU, idle API requests and writes from the audit log);
6. one real agent's footprint (RSS, CPU, writes per hour);
7. end to end: XIDs from the fake NVML library through real agents on their own governed nodes, to the taint
   (with the agent's and the operator's shares; see hack/bench/e2e.py).

All of it under heartbeat traffic: every simulated agent renews its node Lease every --heartbeat seconds
(the nodes spread evenly over the interval), as the real agent does; the rate achieved is recorded.

Writes build/bench/results.json, summary.md and report.png. Tears down everything it started.
"""

# The modules, in the order a run uses them:
#   cli           the command line (sizes, profiles, phases) and the checks that the fleet fits them
#   run           the driver: the results' header, the phases in order, the outputs, the teardown
