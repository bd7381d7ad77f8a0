"""`kubectl gpuhealth`: the on-call view of gpuhealth.

Commands: status, describe NODE, explain XID, release NODE, approve NODE, reject NODE, pause POLICY,
resume POLICY.
Exit codes: 0 ok, 1 API error, 2 usage error or refused. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TextIO

from gpuhealth.api.durations import parse_duration
from gpuhealth.api.names import DEFAULT_DRA_DRIVER
from gpuhealth.api.policy import PolicyError, parse_policy
from gpuhealth.api.status import StoredStatus
from gpuhealth.cli import (
    changes,
    describe_text,
    explain,
    explain_text,
    fleet,
    kubeletview,
    miglayout,
    nodeview,
    render,
)
from gpuhealth.cli.client import Client, load_configuration
from gpuhealth.cli.errors import EXIT_OK, EXIT_USAGE, ApiError, CliError, Refused

PROG = "kubectl gpuhealth"
EPILOG = """\
examples:
  kubectl gpuhealth status                      fleet table, problems first, with the cost of lost capacity
  kubectl gpuhealth status --state AwaitingRepair -o json
  kubectl gpuhealth describe gpu-node-0042      devices, XIDs and their meaning, marks, history, events
  kubectl gpuhealth explain 79                  what an XID means and what gpuhealth does (no cluster needed)
  kubectl gpuhealth release gpu-node-0042       return a repaired AwaitingRepair node (probation follows)
  kubectl gpuhealth release gpu-node-0042 --gpu 3   return one repaired GPU (its DeviceTaintRule goes after probation)
  kubectl gpuhealth approve gpu-node-0042 --gpu 3   approve GPU 3's waiting step as you (approval: Manual, TwoPerson)
  kubectl gpuhealth reject gpu-node-0042 --gpu 3    send GPU 3 to AwaitingRepair instead
  kubectl gpuhealth pause training              stop a policy from acting (resume restores its mode)

exit codes: 0 ok, 1 API error, 2 usage error or refused
"""


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line (exit 2) instead of printing the usage block."""

    def error(self, message: str) -> NoReturn:
        raise Refused(f"{message} (see: {self.prog} --help)")


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 30s, 1m)") from None


def _connection_flags(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: the flags work before or after the command without one default hiding the other.
    p.add_argument(
        "--kubeconfig",
        default=argparse.SUPPRESS,
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)",
    )
    p.add_argument("--context", default=argparse.SUPPRESS, help="kubeconfig context to use")
    p.add_argument(
        "--request-timeout",
        type=_seconds,
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="per-request timeout, e.g. 30s (default 30s)",
    )


def build_parser() -> Parser:
    ap = Parser(
        prog=PROG,
        description="The on-call view of gpuhealth: fleet status, node detail, the XID catalog, release and pause.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _connection_flags(ap)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)

    p = sub.add_parser("status", help="fleet table from GPUNodeHealth and Nodes, with the cost of lost capacity")
    _connection_flags(p)
    p.add_argument("-o", "--output", choices=["json", "wide"], help="json: the same data; wide: more columns")
    p.add_argument("-l", "--selector", default="", help="only Nodes matching this label selector")
    p.add_argument("--policy", default="", help="only nodes governed by this GPUHealthPolicy")
    p.add_argument(
        "--state",
        action="append",
        default=[],
        help="only nodes in this state (repeatable or comma-separated; NoVerdict for unjudged nodes)",
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("describe", help="one node: devices, XIDs, evidence, marks, history, drain, events")
    _connection_flags(p)
    p.add_argument("node", metavar="NODE")
    p.add_argument("-o", "--output", choices=["json"])
    p.add_argument(
        "--event-namespace",
        default=os.environ.get("GPUHEALTH_EVENT_NAMESPACE", "default"),
        help="namespace of the operator's Events about Nodes (default: default)",
    )
    p.add_argument(
        "--agent-namespace",
        default=os.environ.get("GPUHEALTH_LEASE_NAMESPACE", "gpuhealth-system"),
        help="namespace of the agents' heartbeat Leases (default: gpuhealth-system)",
    )
    p.set_defaults(func=cmd_describe)

    p = sub.add_parser("explain", help="what an XID means and what gpuhealth does about it (no cluster needed)")
    _connection_flags(p)  # accepted for uniformity; explain never contacts the cluster
    p.add_argument("xid", metavar="XID", help="the code: 79, XID79, xid-79")
    p.add_argument("-o", "--output", choices=["json"])
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser(
        "release",
        help="return a repaired AwaitingRepair node to gpuhealth (probation follows), or lift a failed burn-in's hold",
    )
    _connection_flags(p)
    p.add_argument("node", metavar="NODE")
    p.add_argument(
        "--force",
        action="store_true",
        help="release even if the node is not AwaitingRepair nor held by a failed burn-in (clears its evidence and "
        "flapping history)",
    )
    p.add_argument(
        "--gpu",
        type=int,
        metavar="N",
        help="release only GPU N (held out on its own by a DeviceTaintRule); the node is left as it is",
    )
    p.set_defaults(func=cmd_release)

    for verb, text in (
        (
            "approve",
            "approve the repair or validation steps waiting in PendingApproval, as the user the API server "
            "knows you as (approval: Manual; TwoPerson counts two different people)",
        ),
        ("reject", "send the GPUs whose steps wait in PendingApproval to AwaitingRepair instead"),
    ):
        p = sub.add_parser(verb, help=text)
        _connection_flags(p)
        p.add_argument("node", metavar="NODE")
        p.add_argument("--gpu", type=int, metavar="N", help=f"{verb} GPU N's waiting step only")
        p.set_defaults(func=cmd_approve if verb == "approve" else cmd_reject)

    p = sub.add_parser("pause", help="set a GPUHealthPolicy's mode to Paused (remembers the previous mode)")
    _connection_flags(p)
    p.add_argument("policy", metavar="POLICY")
    p.set_defaults(func=cmd_pause)

    p = sub.add_parser("resume", help="end a pause: restore the previous mode (or --mode)")
    _connection_flags(p)
    p.add_argument("policy", metavar="POLICY")
    p.add_argument(
        "--mode", choices=list(changes.RESUMABLE), help="mode to resume in (default: the mode before the pause)"
    )
    p.set_defaults(func=cmd_resume)
    return ap


# -- helpers -------------------------------------------------------------------------------------------


class Context:
    """What a command needs from outside: the API (made on first use), the clock, stdout/stderr."""

    def __init__(
        self,
        args: argparse.Namespace,
        out: TextIO,
        err: TextIO,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        client_factory: Callable[[argparse.Namespace], Client] | None = None,
    ) -> None:
        self.args = args
        self.out = out
        self.err = err
        self.clock = clock
        self._factory = client_factory or _make_client
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self._factory(self.args)
        return self._client

    @property
    def color(self) -> bool:
        isatty = getattr(self.out, "isatty", None)
        return bool(isatty and isatty()) and "NO_COLOR" not in os.environ

    def print(self, text: str) -> None:
        self.out.write(text if text.endswith("\n") else text + "\n")

    def warn(self, text: str) -> None:
        self.err.write(f"warning: {text}\n")

    def json(self, data: Mapping[str, Any]) -> None:
        self.out.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def _make_client(args: argparse.Namespace) -> Client:
    cfg = load_configuration(getattr(args, "kubeconfig", None), getattr(args, "context", None))
    return Client(cfg, timeout=getattr(args, "request_timeout", 30.0))


def _states(values: Sequence[str]) -> list[str]:
    return [s.strip() for v in values for s in v.split(",") if s.strip()]


# -- commands ------------------------------------------------------------------------------------------


def cmd_status(ctx: Context) -> int:
    a = ctx.args
    nodes = ctx.client.list_gpu_nodes(a.selector)
    reports = ctx.client.list_reports()
    policies = ctx.client.list_policies()
    summary = fleet.summarize(nodes, reports, policies, ctx.clock(), include_orphans=not a.selector)
    states = _states(a.state)
    if states or a.policy:
        summary = fleet.filter_rows(summary, states, a.policy)
    if a.output == "json":
        ctx.json(summary.to_json())
    else:
        ctx.print(render.render_status(summary, color=ctx.color, wide=a.output == "wide"))
    return EXIT_OK


def _drivers(policy: Mapping[str, Any] | None) -> tuple[str, ...]:
    try:
        return parse_policy(policy).devices.drivers if policy else (DEFAULT_DRA_DRIVER,)
    except PolicyError:
        return (DEFAULT_DRA_DRIVER,)


def _mig_layout(
    ctx: Context, node: str, report: Mapping[str, Any] | None, policy: Mapping[str, Any] | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The node's MIG layout, and what could not be read for it (the rest of describe still shows)."""
    errors: list[str] = []

    def read(fn: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        try:
            return fn()
        except ApiError as e:
            errors.append(str(e))
            return []

    slices = read(lambda: ctx.client.node_resource_slices(node))
    if not miglayout.wanted(report, slices):
        return [], errors
    pods = read(lambda: ctx.client.node_pods(node))
    # Only the claims of the namespaces the node's pods run in: that is where every claim they hold is.
    namespaces = sorted({str((p.get("metadata") or {}).get("namespace") or "") for p in pods} - {""})
    claims = [c for ns in namespaces for c in read(functools.partial(ctx.client.namespace_resource_claims, ns))]
    return miglayout.mig_layout(node, report, slices, claims, pods, _drivers(policy)), errors


def _read_pods(ctx: Context, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], kubeletview.PodLookup]:
    """Each pod that holds a held-out GPU, read once; a pod the user may not read is its error, not a failure."""
    out = {}
    for ns, name in keys:
        try:
            out[(ns, name)] = kubeletview.PodLookup(pod=ctx.client.get_pod(ns, name))
        except ApiError as e:
            out[(ns, name)] = kubeletview.PodLookup(error=str(e))
    return out


def cmd_describe(ctx: Context) -> int:
    a = ctx.args
    node = ctx.client.get_node(a.node)
    report = ctx.client.get_report(a.node)
    if node is None and report is None:
        raise ApiError(f'node "{a.node}" not found, and it has no GPUNodeHealth report')
    policy_name = StoredStatus.of(report).policy
    policy = ctx.client.get_policy(str(policy_name)) if policy_name else None
    events_error = None
    try:
        events = ctx.client.node_events(a.node, a.event_namespace)
    except ApiError as e:
        events, events_error = [], str(e)
    try:
        lease = ctx.client.get_lease(a.agent_namespace, a.node)
    except ApiError:
        lease = None  # not allowed to read Leases: the report's own heartbeat is shown
    model = nodeview.describe_node(a.node, node, report, policy, events, ctx.clock(), lease=lease)
    if events_error:
        model["eventsError"] = events_error
    model["migLayout"], layout_errors = _mig_layout(ctx, a.node, report, policy)
    if layout_errors:
        model["migLayoutErrors"] = layout_errors
    held = kubeletview.held_out_holders(report, model["migLayout"])
    model["kubeletHealth"] = kubeletview.kubelet_view(held, _read_pods(ctx, kubeletview.pods_to_read(held)))
    if a.output == "json":
        ctx.json(model)
    else:
        ctx.print(describe_text.render_describe(model, color=ctx.color))
        if events_error:
            ctx.warn(f"could not list Events: {events_error}")
    return EXIT_OK


def cmd_explain(ctx: Context) -> int:
    model = explain.explain(explain.parse_code(ctx.args.xid))
    if ctx.args.output == "json":
        ctx.json(model)
    else:
        ctx.print(explain_text.render_explain(model))
    return EXIT_OK


def cmd_release(ctx: Context) -> int:
    a = ctx.args
    node = ctx.client.get_node(a.node)
    if node is None:
        raise ApiError(f'node "{a.node}" not found')
    report = ctx.client.get_report(a.node)
    if a.gpu is not None:
        gplan = changes.plan_release_gpu(a.node, report, a.gpu, force=a.force)
        assert gplan.patch is not None
        ctx.client.patch_node(a.node, gplan.patch)
        ctx.print("\n".join(gplan.lines))
        return EXIT_OK
    policy_name = StoredStatus.of(report).policy
    policy = ctx.client.get_policy(str(policy_name)) if policy_name else None
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    plan = changes.plan_release(a.node, report, policy, ctx.clock(), force=a.force, node_annotations=annotations)
    assert plan.patch is not None
    ctx.client.patch_node(a.node, plan.patch)
    ctx.print("\n".join(plan.lines))
    for w in plan.warnings:
        ctx.warn(w)
    return EXIT_OK


def _approval(ctx: Context, reject: bool) -> int:
    a = ctx.args
    if ctx.client.get_node(a.node) is None:
        raise ApiError(f'node "{a.node}" not found')
    report = ctx.client.get_report(a.node)
    # An approval records who gave it, as the API server knows them (the admission policy shipped in
    # manifests/ refuses any other name): what approval: TwoPerson counts. A rejection names nobody.
    user = None if reject else ctx.client.whoami()
    plan = changes.plan_approval(a.node, report, a.gpu, ctx.clock(), reject=reject, user=user)
    assert plan.patch is not None
    ctx.client.patch_node(a.node, plan.patch)  # the annotation only: the operator does the rest
    ctx.print("\n".join(plan.lines))
    return EXIT_OK


def cmd_approve(ctx: Context) -> int:
    return _approval(ctx, reject=False)


def cmd_reject(ctx: Context) -> int:
    return _approval(ctx, reject=True)


def _change_policy(ctx: Context, name: str, planner: Callable[[Mapping[str, Any]], changes.Plan]) -> int:
    for attempt in range(3):
        policy = ctx.client.get_policy(name)
        if policy is None:
            raise ApiError(f'gpuhealthpolicy "{name}" not found')
        plan = planner(policy)
        if plan.patch is None:
            ctx.print("\n".join(plan.lines))
            return EXIT_OK
        try:
            ctx.client.patch_policy(name, plan.patch)
        except ApiError as e:
            if e.status == 409 and attempt < 2:
                continue  # someone changed the policy between our read and write: plan again
            raise
        ctx.print("\n".join(plan.lines))
        for w in plan.warnings:
            ctx.warn(w)
        return EXIT_OK
    raise ApiError(f"gpuhealthpolicy/{name} kept changing while we tried to update it")  # pragma: no cover


def cmd_pause(ctx: Context) -> int:
    return _change_policy(ctx, ctx.args.policy, changes.plan_pause)


def cmd_resume(ctx: Context) -> int:
    mode = ctx.args.mode
    return _change_policy(ctx, ctx.args.policy, lambda p: changes.plan_resume(p, mode))


# -- entry point ---------------------------------------------------------------------------------------


def run(
    argv: Sequence[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    **context: Any,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
        ctx = Context(args, out, err, **context)
        return int(args.func(ctx))
    except CliError as e:
        err.write(f"error: {e}\n")
        return e.exit_code
    except KeyboardInterrupt:
        err.write("error: interrupted\n")
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = run(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # `kubectl gpuhealth status | head`: the reader left; say nothing more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    return code


__all__ = ["EXIT_USAGE", "build_parser", "main", "run"]
