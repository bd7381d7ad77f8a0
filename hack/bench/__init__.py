"""`make bench`: gpuhealth's performance on a fleet of fake GPU nodes (default 1,000) on a real control plane.

Measures, in one run (see docs/bench.md):

1. operator start-up: process start to "watching N GPU nodes", and to every node Healthy, and what its first
   writes waited on (the API server's time per request and the operator's CPU, hack/bench/startup_writes.py);
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

# The modules: the command line and the driver, the phases in the order they run, the outputs, the docs
# renderers, and the building blocks every phase uses.
#   cli           the command line (sizes, profiles, phases) and the checks that the fleet fits them
#   run           the driver: the results' header, which phases run in which order, the outputs, the teardown
#   context       what the phases share: the identities, what the run started (Started), the fleet (Bench)
#   startup       control plane, real agents, pods, first reports and heartbeats, slices, watches, operator start-up
#   startup_writes  what start-up waited on: the audit log's time per request and the workers inside the server
#   detection     detection to taint, and the no-logic floor chain it is compared with
#   floors        every other path's no-logic floor (issue #52), taken by the phases right after their figure
#   e2e           end to end through real agents on the fake NVML library
#   storm         the storm at 100%, the recovery, the breaker at its limit
#   traffic       background fact traffic, and detection under it
#   devices       DRA nodes: DeviceTaintRules one GPU at a time, the device storm, the resets
#   footprint     the idle window, and what the run cost the operator, the agents and the API server
#   mig           the MIG fleet (--phases mig)
#   resilience    what warm restart, failover and the drain storm share (--phases restart,failover,drain)
#   restart       the warm restart: how long the fleet is blind, what a restart writes
#   failover      SIGKILL of the acting replica under Kopf peering to a new fault's taint
#   drain         the drain storm, the bench playing the checkpointing pods' handshake
#   drain_workload  the drain storm's pod mix and the audit-log figures it is judged by
#   report        results.json, series.json, summary.md: the verdicts and the summary
#   targets       what each figure is held to, by fleet size, shared by the summary and the docs
#   details       the detail sentence of each figure block, for the summary and the docs
#   plot          report.png
#   mig_report    the MIG fleet's targets, summary section and docs block
#   docs          the figures in docs/development.md and docs/bench.md, rendered from the filed runs
#   scaling_docs  docs/scaling.md's table and plot across fleet sizes
#   cluster       the control plane with faster clients, the policy under test, the pods
#   fleet         the simulated agents (the agent's own publisher and Lease) and their heartbeats
#   watch         the independent watches the figures are read from
#   support       names, clients, samplers, audit-log rates (devkit/audit.py reads the log), statistics
#                 and the phase clock
