"""Checkpoint handshake helper for training loops and sidecars (``gpuhealth.workload``).

A pod opts in with the annotation ``gpuhealth.dev/checkpoint: annotation`` on its template. When its
node must be drained, gpuhealth sets ``gpuhealth.dev/checkpoint-requested: <RFC3339>`` on the pod.
The workload sees it through a downward-API annotations file (no API access needed), saves a
checkpoint, and acknowledges with ``gpuhealth.dev/checkpoint-completed: <RFC3339>``; only then is the
pod evicted. Acknowledging writes the pod's own annotation, which needs ``patch`` on pods; keep that
in a sidecar (``python -m gpuhealth.workload sidecar``) so the training container needs no API access:
the trainer touches a file, the sidecar acknowledges.

    from gpuhealth.workload import CheckpointRequest
    req = CheckpointRequest()               # reads /etc/podinfo/annotations
    for step in training:
        ...
        if req.pending():
            save_checkpoint()
            req.mark_done()                 # touches /var/run/gpuhealth/checkpoint-done for the sidecar
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import time
from pathlib import Path

from gpuhealth.api.names import CHECKPOINT_COMPLETED, CHECKPOINT_REQUESTED
from gpuhealth.api.timeutil import parse_time

# Public names of this helper (training code imports them); the values are the contract's.
REQUESTED = CHECKPOINT_REQUESTED
COMPLETED = CHECKPOINT_COMPLETED
DEFAULT_ANNOTATIONS = Path(os.environ.get("GPUHEALTH_ANNOTATIONS_FILE", "/etc/podinfo/annotations"))
DEFAULT_DONE_FILE = Path(os.environ.get("GPUHEALTH_CHECKPOINT_DONE_FILE", "/var/run/gpuhealth/checkpoint-done"))

log = logging.getLogger(__name__)


def parse_downward_annotations(text: str) -> dict[str, str]:
    """The kubelet writes one ``key="value"`` per line, the value a Go-quoted string."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw.strip('"')
        out[key.strip()] = str(value)
    return out


class CheckpointRequest:
    """Whether gpuhealth asked this pod to checkpoint, from the downward-API annotations file."""

    def __init__(self, annotations_file: Path = DEFAULT_ANNOTATIONS, done_file: Path = DEFAULT_DONE_FILE) -> None:
        self.annotations_file = Path(annotations_file)
        self.done_file = Path(done_file)

    def annotations(self) -> dict[str, str]:
        try:
            return parse_downward_annotations(self.annotations_file.read_text())
        except OSError:
            return {}

    def requested_at(self) -> dt.datetime | None:
        return parse_time(self.annotations().get(CHECKPOINT_REQUESTED))

    def pending(self) -> bool:
        """A request exists and has not been acknowledged yet."""
        ann = self.annotations()
        requested = parse_time(ann.get(CHECKPOINT_REQUESTED))
        done = parse_time(ann.get(CHECKPOINT_COMPLETED))
        return requested is not None and (done is None or done < requested.replace(microsecond=0))

    def mark_done(self) -> None:
        """For a trainer without API access: tell the sidecar the checkpoint is saved."""
        self.done_file.parent.mkdir(parents=True, exist_ok=True)
        self.done_file.write_text(dt.datetime.now(dt.UTC).isoformat())


def acknowledge(namespace: str, name: str, api_client: object | None = None) -> str:
    """Set ``checkpoint-completed`` on the pod (needs patch on this pod); returns the timestamp written."""
    from kubernetes import client, config

    if api_client is None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    core = client.CoreV1Api(api_client)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {CHECKPOINT_COMPLETED: now}}})
    return now


def sidecar(poll_s: float = 1.0, once: bool = False) -> None:
    """Acknowledge each request once the trainer has marked its checkpoint done."""
    ns, name = os.environ["POD_NAMESPACE"], os.environ["POD_NAME"]
    req = CheckpointRequest()
    while True:
        requested = req.requested_at()
        if requested is not None and req.pending() and req.done_file.exists():
            done = dt.datetime.fromtimestamp(req.done_file.stat().st_mtime, dt.UTC)
            if done >= requested.replace(microsecond=0):
                log.info("checkpoint saved at %s: acknowledging %s/%s", done.isoformat(), ns, name)
                acknowledge(ns, name)
                if once:
                    return
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m gpuhealth.workload", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status", help="print whether a checkpoint is requested (exit 0 yes, 1 no)")
    sub.add_parser("sidecar", help="acknowledge requests once the trainer touched the done file")
    ack = sub.add_parser("ack", help="acknowledge now ($POD_NAMESPACE/$POD_NAME)")
    ack.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE"))
    ack.add_argument("--name", default=os.environ.get("POD_NAME"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if args.cmd == "status":
        pending = CheckpointRequest().pending()
        print("requested" if pending else "none")
        raise SystemExit(0 if pending else 1)
    if args.cmd == "ack":
        print(acknowledge(args.namespace, args.name))
        return
    sidecar()


if __name__ == "__main__":
    main()
