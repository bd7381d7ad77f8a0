"""What must hold of the decisions above one GPU's quarantine under chaos (pure).

The decision scenarios (domain_kills, rack_kills, validation_kills, burnin_kills, approval_kills)
SIGKILL the operator (and crash the API server) while one of these decisions is being written, and
these functions judge what they sampled and what the audit log holds:

- an NVLink domain is never half out once settled: a stretch in which some members carry gpuhealth's
  taint and others do not, sampled for longer than the settling time, fires, whether the domain was
  leaving or returning (:func:`half_domains`);
- no node of a rack is held alone for its own power brake while the rack's episode lasts (from the
  moment ``minNodes`` of its nodes report the brake until none does): its status reason
  ``PowerBrake``, or gpuhealth's taint with that value (:func:`rack_nodes_alone`);
- never a second Job for one node validation: two successful creates of one name, or more names (in
  the audit log or as Job objects) than the scenario started validations on that node
  (:func:`duplicate_node_validations`);
- no node held for a validation (after a release, a burn-in) returns unvalidated: once seen held, the
  node seen free again only after one of its node validation Jobs, not yet succeeded when the hold was
  first seen, has succeeded (the Jobs' own status, not the operator's record; :func:`returned_unvalidated`);
- an approved step runs exactly once: every successful create of a step's Job (reset, validation)
  spends an approval given for that GPU before the create was received, one approval per Job, and
  every approval is spent by the end (:func:`approval_problems`).

Spelled out here rather than imported from the operator (names, reasons), so a broken product cannot
also bend the judgement of it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import pairwise

from hack.chaos.ladder import JobCreate, parse_job_name

OWN_BRAKE = "PowerBrake"  # a node's own power-brake finding: its status reason and its taint's value
NODE_VALIDATION_PREFIX = "gpuhealth-validate-"
_NODE_TAIL = re.compile(r"-node-([0-9a-f]{8})$")
_GPU_VALIDATION_TAIL = re.compile(r"-(\d+)-(\d+)-([0-9a-f]{8})$")


# -- NVLink domains ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DomainSample:
    at: float  # the sampler's monotonic clock, seconds
    domain: str
    out: Mapping[str, bool]  # member -> gpuhealth's taint on its Node
    # The operator was acting when sampled: its process up and its start-up over (every node passed
    # once, ``gpuhealth_startup_seconds`` set). Killed, importing or listing, it can finish no decision.
    acting: bool = True


@dataclass(frozen=True)
class HalfStretch:
    """A stretch in which a domain was sampled partly out (some members tainted, some not)."""

    domain: str
    seconds: float  # first to last such sample
    acting_s: float  # of those, the time the operator was acting (both ends of a sampling gap acting)
    last: DomainSample


def half_stretches(samples: Iterable[DomainSample]) -> list[HalfStretch]:
    """Each stretch in which a domain was sampled partly out."""
    by_domain: dict[str, list[DomainSample]] = {}
    for sample in sorted(samples, key=lambda s: s.at):
        by_domain.setdefault(sample.domain, []).append(sample)
    out = []
    for domain, seq in sorted(by_domain.items()):
        stretch: list[DomainSample] = []
        for s in [*seq, None]:
            if s is not None and len(set(s.out.values())) > 1:
                stretch.append(s)
                continue
            if stretch:
                acting = sum(b.at - a.at for a, b in pairwise(stretch) if a.acting and b.acting)
                out.append(HalfStretch(domain, stretch[-1].at - stretch[0].at, acting, stretch[-1]))
            stretch = []
    return out


def half_domains(samples: Iterable[DomainSample], settle_s: float) -> list[str]:
    """Each stretch in which a domain was sampled partly out for longer than ``settle_s`` seconds of
    the operator's acting time: a decision left half written. The operator writes members one by
    one, so a shorter stretch is the decision in flight; time it spent killed, importing or listing
    after a restart is not held against it (under load a start-up alone took 10-13 s, and the kill
    monkey may kill it again during one), but every second it acted is."""
    out = []
    for h in half_stretches(samples):
        if h.acting_s > settle_s:
            tainted = sorted(n for n, o in h.last.out.items() if o)
            clear = sorted(n for n, o in h.last.out.items() if not o)
            out.append(
                f"NVLink domain {h.domain} half out for {h.acting_s:.1f} s of the operator's acting time "
                f"({h.seconds:.1f} s in all; over {settle_s:.0f} s): {tainted} tainted, {clear} not"
            )
    return out


class ActingBudget:
    """A wait counted in the operator's acting time, as :func:`half_domains` counts it: an interval
    between two looks counts only when the operator was acting at both ends. A start-up under load
    (25-45 s on 2 loaded cores, over and over under the kill monkey) is not held against the operator;
    ``cap_s`` of wall time ends the wait regardless, so a dead operator still ends the scenario."""

    def __init__(self, budget_s: float, cap_s: float, start: float, acting: bool) -> None:
        self.budget_s, self.cap_s, self.start = budget_s, cap_s, start
        self.acting_s = 0.0
        self._last, self._was = start, acting

    def look(self, at: float, acting: bool) -> bool:
        """Record a look; whether the wait is over (acting budget or wall cap spent)."""
        if self._was and acting:
            self.acting_s += max(0.0, at - self._last)
        self._last, self._was = at, acting
        return self.acting_s >= self.budget_s or at - self.start >= self.cap_s


def settled_domain_problems(domain: str, out: Mapping[str, bool], want_out: bool) -> list[str]:
    """Once the scenario has waited for the decision: every member out (the fault stands) or every member
    back (it cleared), in one read of the Nodes."""
    wrong = sorted(n for n, o in out.items() if o != want_out)
    if not wrong:
        return []
    return [
        f"NVLink domain {domain} settled {'out' if want_out else 'back'}, but {wrong} "
        f"{'are not tainted' if want_out else 'are still tainted'} (of {sorted(out)})"
    ]


# -- racks -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RackSample:
    at: float
    rack: str
    braked: frozenset[str]  # members whose report says a GPU is under the hardware power brake
    own: Mapping[str, str] = field(default_factory=dict)  # member -> how it is held for its own brake


def rack_nodes_alone(samples: Iterable[RackSample], min_nodes: int) -> list[str]:
    """A member of a rack held alone for its own power brake while the rack's episode lasts: from the
    first sample with at least ``min_nodes`` members braked until the first with none braked. One
    line per (episode, node)."""
    by_rack: dict[str, list[RackSample]] = {}
    for s in sorted(samples, key=lambda s: s.at):
        by_rack.setdefault(s.rack, []).append(s)
    out = []
    for rack, seq in sorted(by_rack.items()):
        episode = 0  # 0: none running; n: the n-th episode of this rack
        seen = 0
        told: set[tuple[int, str]] = set()
        for s in seq:
            if not episode and len(s.braked) >= min_nodes:
                seen += 1
                episode = seen
            elif episode and not s.braked:
                episode = 0
            if not episode:
                continue
            for node, how in sorted(s.own.items()):
                if (episode, node) in told:
                    continue
                told.add((episode, node))
                out.append(
                    f"rack {rack} episode {episode}: {node} held alone for its own power brake ({how}) while "
                    f"{len(s.braked)} of the rack's nodes report the brake ({sorted(s.braked)})"
                )
    return out


def own_brake(reason: str | None, taint_value: str | None) -> str:
    """How a node is held for its own power brake ('' if it is not): its status reason, its taint."""
    parts = []
    if reason == OWN_BRAKE:
        parts.append(f"status.reason {OWN_BRAKE}")
    if taint_value == OWN_BRAKE:
        parts.append(f"taint value {OWN_BRAKE}")
    return ", ".join(parts)


# -- node validations ----------------------------------------------------------------------------------


def parse_node_validation(name: str) -> str | None:
    """``gpuhealth-validate-<node>-node-<hash>`` -> the node as the name holds it (None: not a node's)."""
    m = _NODE_TAIL.search(name)
    if not name.startswith(NODE_VALIDATION_PREFIX) or m is None:
        return None
    return name[len(NODE_VALIDATION_PREFIX) : m.start()]


def duplicate_node_validations(
    creates: Iterable[JobCreate], started: Mapping[str, int], seen: Mapping[str, AbstractSet[str]] | None = None
) -> list[str]:
    """A second Job for one node validation: a name created twice (deleted and made again), or more
    names for a node than the validations the scenario started there (``started``: node -> count),
    counting both the audit log's successful creates and the names ``seen`` any other way (node ->
    names: the Job objects, the sampler's). The audit log alone can miss a create: when the API
    server is SIGKILLed after the Job is stored and before its audit entry is written (the decision
    scenarios crash it as a Job appears, while the next node's create may be in flight)."""
    names: dict[str, list[str]] = {}
    for c in creates:
        node = parse_node_validation(c.name)
        if node is None or not 200 <= c.code < 300:
            continue
        names.setdefault(node, []).append(c.name)
    out = []
    for node in sorted(set(names) | set(seen or {})):
        made = names.get(node, [])
        for name in sorted({n for n in made if made.count(n) > 1}):
            out.append(f"{node}: node validation Job {name} created {made.count(name)} times (audit log)")
        every = set(made) | set((seen or {}).get(node, ()))
        want = started.get(node, 0)
        if len(every) > want:
            out.append(
                f"{node}: {len(every)} node validation Jobs for {want} validation(s) started "
                f"(audit log and Job objects): {sorted(every)}"
            )
    return out


def unaudited(creates: Iterable[JobCreate], seen: Mapping[str, AbstractSet[str]]) -> list[str]:
    """Node validation Jobs seen (objects, samples) with no successful create in the audit log: the
    API server crashed between storing one and logging it. Counted, not a violation: the Job exists."""
    logged = {c.name for c in creates if 200 <= c.code < 300}
    return sorted(n for names in seen.values() for n in names if n not in logged)


def unaudited_creates(creates: Iterable[JobCreate], seen: Mapping[str, dt.datetime]) -> list[JobCreate]:
    """A create for each Job ``seen`` (name -> its creationTimestamp) that has no successful create in
    the audit log (the API server SIGKILLed between storing it and logging it), received at the latest
    moment it can have been: ``creationTimestamp`` holds whole seconds, so one second after it. Judged
    with the audited ones, such a Job still spends an approval, at one second's resolution."""
    logged = {c.name for c in creates if 200 <= c.code < 300}
    return [JobCreate(n, at + dt.timedelta(seconds=1), 201) for n, at in sorted(seen.items()) if n not in logged]


@dataclass(frozen=True)
class HoldSample:
    at: float
    node: str
    held: bool  # the taint that holds it for the validation is on (gpuhealth's unhealthy or burn-in taint)
    passed: frozenset[str]  # the node's validation Jobs seen succeeded (their status), up to this sample


def returned_unvalidated(samples: Iterable[HoldSample]) -> list[str]:
    """A node seen held and later seen free, with no validation Job of it succeeded in between (none
    that had not already succeeded when the hold was first seen)."""
    by_node: dict[str, list[HoldSample]] = {}
    for s in sorted(samples, key=lambda s: s.at):
        by_node.setdefault(s.node, []).append(s)
    out = []
    for node, seq in sorted(by_node.items()):
        held_since: HoldSample | None = None
        for s in seq:
            if s.held:
                held_since = held_since or s
                continue
            if held_since is not None and not (s.passed - held_since.passed):
                out.append(
                    f"{node}: held since {held_since.at:.1f} s and free at {s.at:.1f} s with no validation Job "
                    f"succeeded in between (succeeded: {sorted(s.passed)})"
                )
            held_since = None
    return out


# -- approvals ------------------------------------------------------------------------------------------


def step_of(name: str) -> tuple[str, str, int] | None:
    """A GPU step's Job name -> (kind, node, GPU index): ``gpuhealth-reset-<node>-<index>-<attempt>-<hash>``
    or ``gpuhealth-validate-<node>-<index>-<attempt>-<hash>`` (a node's validation is not a GPU's step)."""
    reset = parse_job_name(name)
    if reset is not None:
        return "reset", reset[0], reset[1]
    m = _GPU_VALIDATION_TAIL.search(name)
    if name.startswith(NODE_VALIDATION_PREFIX) and m is not None:
        return "validation", name[len(NODE_VALIDATION_PREFIX) : m.start()], int(m.group(1))
    return None


def approval_problems(
    creates: Iterable[JobCreate], approvals: Mapping[tuple[str, int], Iterable[dt.datetime]], settled: bool = True
) -> list[str]:
    """Each successful create of a GPU step's Job must spend one approval of that (node, GPU) given
    before the create was received, the earliest one unspent; a create with none left ran a step
    unapproved (or an approved one a second time). With ``settled``, an approval never spent is a
    step approved that never ran."""
    left: dict[tuple[str, int], list[dt.datetime]] = {k: sorted(v) for k, v in approvals.items()}
    out = []
    timed = [(c.at, c) for c in creates if 200 <= c.code < 300 and c.at is not None]
    for at, c in sorted(timed, key=lambda x: x[0]):
        step = step_of(c.name)
        if step is None:
            continue
        kind, node, gpu = step
        tokens = left.get((node, gpu), [])
        given = [t for t in tokens if t <= at]
        if not given:
            out.append(
                f"{node} GPU {gpu}: {kind} Job {c.name} created at {at:%H:%M:%S.%f} with no approval left "
                f"(approvals given: {[f'{t:%H:%M:%S.%f}' for t in sorted(approvals.get((node, gpu), []))]})"
            )
            continue
        tokens.remove(given[0])
    if settled:
        for (node, gpu), tokens in sorted(left.items()):
            for t in tokens:
                out.append(f"{node} GPU {gpu}: approved at {t:%H:%M:%S.%f}, but no step's Job ran on it")
    return out
