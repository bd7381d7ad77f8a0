"""Prometheus metrics of the operator (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuhealth.api.names import Signal
from gpuhealth.api.remediation import StepKind
from gpuhealth.api.remediation_status import Result
from gpuhealth.api.validation import DONE as VALIDATION_DONE
from gpuhealth.catalog import xid as xid_catalog

REGISTRY = CollectorRegistry(auto_describe=True)

NODES = Gauge("gpuhealth_nodes", "GPU nodes by gpuhealth state", ["policy", "state"], registry=REGISTRY)
ACTIONS = Counter(
    "gpuhealth_actions_total",
    "Actions taken on Nodes, by kind and reason",
    ["action", "reason", "mode"],
    registry=REGISTRY,
)
FAULTS = Counter(
    "gpuhealth_faults_total",
    "Faults detected, by signal and XID code (empty if not an XID)",
    ["signal", "code"],
    registry=REGISTRY,
)
DETECTION_TO_ACTION = Histogram(
    "gpuhealth_detection_to_action_seconds",
    "From the fault's timestamp in the report to gpuhealth's taint on the Node",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
SLOW_NODES = Gauge(
    "gpuhealth_slow_nodes",
    "Nodes held out for a slow, not broken, signal (power brake, HW slowdown, a degraded link or NIC): "
    "their own budget, maxSlow",
    ["policy"],
    registry=REGISTRY,
)
SLOW_GPUS = Gauge(
    "gpuhealth_slow_gpus",
    "GPUs held out for a slow, not broken, signal (their nodes' and those held out one by one): "
    "degraded capacity, apart from the broken",
    ["policy"],
    registry=REGISTRY,
)
BROKEN_GPUS = Gauge(
    "gpuhealth_broken_gpus",
    "GPUs held out for a fault that is not slow-only: broken capacity (gpuhealth_gpus_out_of_service less "
    "gpuhealth_slow_gpus)",
    ["policy"],
    registry=REGISTRY,
)
DOMAIN_FINDINGS = Gauge(
    "gpuhealth_domain_findings",
    "Nodes of an NVLink domain held out as one for a domain-scope fault (0 when it cleared)",
    ["policy", "domain"],
    registry=REGISTRY,
)
RACK_FINDINGS = Gauge(
    "gpuhealth_rack_findings",
    (
        "Nodes of a rack under a power brake counted as one rack finding, while the rack's episode lasts "
        "(0 once no node of it is braked, or when fewer than rack.minNodes were)"
    ),
    ["policy", "rack", "reason"],
    registry=REGISTRY,
)
BREAKER_OPEN = Gauge(
    "gpuhealth_breaker_open",
    "1 when the policy's circuit breaker holds quarantines back",
    ["policy"],
    registry=REGISTRY,
)
INVALID_INPUT = Counter(
    "gpuhealth_invalid_input_total",
    "Reports or policies refused by the operator",
    ["kind"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "gpuhealth_reconcile_errors_total", "Reconciles that failed and were retried", registry=REGISTRY
)
CONFLICTS = Counter(
    "gpuhealth_write_conflicts_total",
    "Optimistic-concurrency conflicts (409) retried",
    ["kind"],
    registry=REGISTRY,
)
GPUS_OUT_OF_SERVICE = Gauge(
    "gpuhealth_gpus_out_of_service",
    "GPUs held out of service (quarantined, draining, awaiting repair, recovering), by policy and state",
    ["policy", "state"],
    registry=REGISTRY,
)
EVENTS_DROPPED = Counter(
    "gpuhealth_events_dropped_total", "Events that could not be posted even after retries", registry=REGISTRY
)
RECONCILES = Counter(
    "gpuhealth_reconciles_total",
    "Node reconciles run (a heartbeat that changes no fact must not add to it)",
    registry=REGISTRY,
)
LEASE_RENEWALS = Counter(
    "gpuhealth_lease_renewals_total",
    "Agent node Lease renewals seen (each only refreshes the agent's freshness record)",
    registry=REGISTRY,
)
STARTUP_SECONDS = Gauge(
    "gpuhealth_startup_seconds",
    "From the operator's start to every GPU node passed once with its pods in (0 until then; a standby "
    "replica's includes its wait to act)",
    registry=REGISTRY,
)
LEASE_RECONCILES = Counter(
    "gpuhealth_lease_reconciles_total",
    "Reconciles queued by a Lease renewal (only for an Unknown node, or one with no verdict yet)",
    registry=REGISTRY,
)

# Every list-then-watch (controller/intake/reflector.py), one family, labelled by what it watches.
WATCHES = ("nodes", "reports", "pods", "leases", "slices")
WATCH_EVENTS = Counter(
    "gpuhealth_watch_events_total",
    "Watch events received (added, modified, deleted), by what is watched",
    ["watch"],
    registry=REGISTRY,
)
WATCH_ERRORS = Counter(
    "gpuhealth_watch_errors_total",
    "List or watch connections that failed and were resumed after a delay, by what is watched",
    ["watch"],
    registry=REGISTRY,
)
WATCH_RELISTS = Counter(
    "gpuhealth_watch_relists_total",
    "Full lists, at start and after the watch's resourceVersion expired (410 Gone), by what is watched",
    ["watch"],
    registry=REGISTRY,
)

# Label values known in advance start at zero, so a dashboard panel or rate() has a series before
# the first such event (an absent series reads as "no data", not as "none").
for _kind in ("GPUHealthPolicy", "GPUNodeHealth"):
    INVALID_INPUT.labels(_kind)
CONFLICTS.labels("reconcile")
# Every signal a quarantine can be for, and an XID of each code the catalog takes a node out for, start
# at zero: a series born at 1 with its first fault shows rate() and increase() no increase, so the
# faults panels drew the story's XID 79 at 0 and GPUHealthXIDRate missed the first fault of each code
# (a real Prometheus in tests/integration/test_real_node.py found it). An XID code that only a policy's
# override acts on still starts with its first fault.
for _signal in Signal:
    if _signal != Signal.XID:
        FAULTS.labels(str(_signal), "")
for _entry in xid_catalog.all_entries():
    if _entry.default_action not in ("ignore", "observe"):
        FAULTS.labels(str(Signal.XID), str(_entry.code))
for _watched in WATCHES:
    for _family in (WATCH_EVENTS, WATCH_ERRORS, WATCH_RELISTS):
        _family.labels(_watched)
DEVICES = Gauge(
    "gpuhealth_devices",
    "GPUs with a record, by their own gpuhealth state (InService, Quarantined, Draining, AwaitingRepair, "
    "Recovering), on the nodes each policy governs",
    ["policy", "state"],
    registry=REGISTRY,
)
DEVICE_RULES = Gauge(
    "gpuhealth_device_rules",
    "gpuhealth's DeviceTaintRules, by policy and the kind of device they hold out (gpu: a full GPU, "
    "mig: a MIG device or placement)",
    ["policy", "kind"],
    registry=REGISTRY,
)
PEER_HOLDS = Gauge(
    "gpuhealth_peer_holds",
    "GPUs held out only as the NVLink peer of a GPU under P2P-aware repair (reason NVLinkPeer): idle "
    "capacity that returns with the repair, not broken GPUs",
    ["policy"],
    registry=REGISTRY,
)
DEVICE_ACTIONS = Counter(
    "gpuhealth_device_actions_total",
    "Actions on single GPUs (DeviceTaintRules created and deleted, device drains), by kind and reason",
    ["action", "reason", "mode"],
    registry=REGISTRY,
)
REMEDIATIONS = Counter(
    "gpuhealth_remediations_total",
    "Repair ladder steps ended (or handed off), by step (GPUReset, NodeReboot, Replace) and result",
    ["step", "result"],
    registry=REGISTRY,
)
# Every (step, result) starts at zero: the LadderExhausted alert's increase() needs a series to
# compare before the first ladder ever reaches Replace.
for _step in StepKind:
    for _result in Result:
        REMEDIATIONS.labels(str(_step), str(_result))
REMEDIATION_MTTR = Histogram(
    "gpuhealth_remediation_mttr_seconds",
    "From a GPU leaving service to its return after a repair, by the ladder step that repaired it",
    ["step"],
    buckets=(10, 30, 60, 300, 600, 1800, 3600, 7200, 21600, 86400),
    registry=REGISTRY,
)
VALIDATIONS = Counter(
    "gpuhealth_validations_total",
    "Validations (spec.validation) of a repaired GPU ended, by result (Passed, Failed, TimedOut, Lost)",
    ["result"],
    registry=REGISTRY,
)
for _outcome in VALIDATION_DONE:
    VALIDATIONS.labels(str(_outcome))
VALIDATION_DURATION = Histogram(
    "gpuhealth_validation_duration_seconds",
    "From a validation Job's start to its verdict",
    buckets=(10, 30, 60, 120, 300, 600, 1800, 3600, 7200),
    registry=REGISTRY,
)
REPEAT_OFFENDERS = Counter(
    "gpuhealth_repeat_offenders_total",
    "GPUs that repairs fixed (spec.remediation.repeatOffenders.maxRepairs times within its window) and that "
    "failed again: sent straight to Replace",
    registry=REGISTRY,
)
GPU_TIME_BETWEEN_FAILURES = Histogram(
    "gpuhealth_gpu_time_between_failures_seconds",
    "From a GPU's previous quarantine to its next, observed when a GPU back in service (after a repair "
    "or probation) is taken out again",
    buckets=(300, 1800, 3600, 6 * 3600, 86400, 3 * 86400, 7 * 86400, 30 * 86400, 90 * 86400),
    registry=REGISTRY,
)
# A child per step exports its buckets at zero, so the MTTR panel has series before the first repair.
for _step in StepKind:
    REMEDIATION_MTTR.labels(str(_step))
