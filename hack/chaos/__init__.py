"""Fault injection against a real local control plane: `make chaos` and `make soak` (``python -m
hack.chaos``) and, with small counts, tests/integration/test_chaos_short.py. docs/chaos.md says what
each scenario and invariant proves.

Everything of chaos is in this one package, so the runner, its scenarios and the checks they are
judged by move and change together; what it shares with the tests and the bench (the local control
plane, real agents, the fake NVML library, the audit log) is devkit.
"""

# The modules:
#   run          the command line and the driver: groups of scenarios per control plane, the report
#   docs         the chaos and soak figures in docs/development.md and docs/chaos.md, rendered from filed runs
#   scenarios/   one module per scenario, the registry that names them and runs one with its checks
#   invariants   what must hold after (and, where sampled, during) every scenario
#   soak         random faults, kills and node churn for minutes; the operator's resource slopes
#   foreign      the foreign writer's log, and the taints and cordons gpuhealth must not lift
#   freshness    nothing Healthy without a fresh report
#   ladder       what must hold of the repair ladder (GPU resets) when the operator is killed mid-step
#   devicerules  what must hold of DeviceTaintRules and device drains
#   decisions    what must hold of the decisions above one GPU: an NVLink domain, a rack, a node's
#                validation or burn-in, an approved step (the *_kills decision scenarios)
#   fieldpath    whether an API server refusal names exactly one field path (bad_input)
#   kopf-peering*.yaml  Kopf's peering CRD and object, when manifests/ has none
#
# Eviction order from the audit log and RFC 3339 parsing are devkit's (devkit/podorder.py,
# devkit/timeparse.py): the bench's drain storm uses them too, and hack/bench never imports hack/chaos.
