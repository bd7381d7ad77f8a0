"""The pods holding each GPU: the pod-resources answer decoded from its wire format, mapped onto the
sampled GPUs and MIG devices by UUID, read through a real gRPC server on a unix socket, and carried
into the report (a failure reported, never raised)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuhealth.agent.model import DeviceFacts, NvmlStatus, PodHold, PodResources, Snapshot
from gpuhealth.agent.pod_resources import (
    LIST_METHOD,
    MAX_PODS,
    Allocation,
    KubeletPodResources,
    PodResourcesReader,
    WireError,
    assign_pods,
    decode_list_response,
    fields,
)
from gpuhealth.agent.report import AgentInfo, ReportBuilder, facts_changed
from gpuhealth.agent.runner import Agent, AgentConfig
from gpuhealth.agent.source import DeviceSample, SourceEvents
from gpuhealth.agent.transport import NullTransport
from gpuhealth.api.report import MigDevice, parse_report

T = datetime(2026, 12, 1, tzinfo=UTC)
GPU = "nvidia.com/gpu"
MIG_RES = "nvidia.com/mig-3g.40gb"
READ = PodResources(True)

# -- an encoder of the wire format, for the tests only (the agent only decodes) -----------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, value: bytes | str | int, wire: int | None = None) -> bytes:
    if isinstance(value, int) and wire in (None, 0):
        return varint(number << 3) + varint(value)
    if isinstance(value, int):  # fixed width
        assert wire in (1, 5)
        return varint(number << 3 | wire) + value.to_bytes(8 if wire == 1 else 4, "little")
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def devices(resource: str, *ids: str, numa: int | None = None) -> bytes:
    body = field(1, resource) + b"".join(field(2, i) for i in ids)
    if numa is not None:  # TopologyInfo{repeated NUMANode nodes = 1}, NUMANode{int64 ID = 1}
        body += field(3, field(1, field(1, numa)))
    return body


def container(name: str, *device_msgs: bytes, cpus: tuple[int, ...] = ()) -> bytes:
    body = field(1, name) + b"".join(field(2, d) for d in device_msgs)
    if cpus:  # repeated int64 cpu_ids = 3, packed
        body += field(3, b"".join(varint(c) for c in cpus))
    # ContainerMemory{memory_type = 1, size = 2} and a DRA claim: skipped
    body += field(4, field(1, "memory") + field(2, 1 << 30))
    body += field(5, field(2, "claim") + field(3, "ns") + field(4, field(2, "gpu.nvidia.com")))
    return body


def pod(namespace: str, name: str, *containers: bytes) -> bytes:
    return field(1, name) + field(2, namespace) + b"".join(field(3, c) for c in containers)


def response(*pods: bytes) -> bytes:
    return b"".join(field(1, p) for p in pods)


# -- the decoder ---------------------------------------------------------------------------------------


def test_a_list_answer_decodes_to_one_allocation_per_container_and_device() -> None:
    data = response(
        pod(
            "ml",
            "train-0",
            container("main", devices(GPU, "GPU-aaa", "GPU-bbb", numa=1), cpus=(2, 3)),
            container("sidecar", devices("example.com/nic", "nic-0")),
        ),
        pod("default", "idle", container("c")),  # no devices
        pod("ml", "infer-0", container("main", devices(MIG_RES, "MIG-ccc::2"))),
    )
    assert decode_list_response(data) == (
        Allocation("ml", "infer-0", "main", MIG_RES, "MIG-ccc::2"),
        Allocation("ml", "train-0", "main", GPU, "GPU-aaa"),
        Allocation("ml", "train-0", "main", GPU, "GPU-bbb"),
        Allocation("ml", "train-0", "sidecar", "example.com/nic", "nic-0"),
    )
    assert decode_list_response(b"") == ()  # no pods


def test_fields_the_agent_does_not_know_are_skipped() -> None:
    # A newer kubelet's fields (any number, every wire type) around the known ones change nothing.
    extra = field(9, 7) + field(10, 5, wire=1) + field(11, 6, wire=5) + field(12, "new")
    data = response(extra + pod("ml", "p", extra + container("c", extra + devices(GPU, "GPU-a") + extra)))
    data += field(2, "pod-level cpu ids")  # a field of the response itself
    assert decode_list_response(data) == (Allocation("ml", "p", "c", GPU, "GPU-a"),)


def test_fields_reads_each_wire_type() -> None:
    data = field(1, 300) + field(2, "é") + field(3, 2**63, wire=1) + field(4, 7, wire=5)
    assert list(fields(data)) == [(1, 300), (2, "é".encode()), (3, 2**63), (4, 7)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x0a\x05abc", "field 1: 5 bytes announced, 3 left"),
        (b"\x0a", "truncated varint"),
        (b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "varint longer than 10 bytes"),
        (b"\x0b", "wire type 3"),
        (b"\x00\x01", "field number 0"),
        (b"\x09\x01\x02", "truncated fixed-width"),
        (field(1, 5), "pod_resources: a message field sent as a number"),
        (response(field(1, 5)), "PodResources.name: a string field sent as a number"),
        (response(pod("ml", "p", field(2, field(2, 9)))), "ContainerDevices.device_ids: a string field"),
    ],
)
def test_bytes_that_are_not_the_message_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_list_response(data)


def test_a_replica_suffix_is_not_part_of_the_uuid() -> None:
    # k8s-device-plugin (internal/rm/devices.go NewAnnotatedID): "<uuid>::<replica>" under time-slicing/MPS.
    assert Allocation("ns", "p", "c", GPU, "GPU-aaa::3").uuid == "GPU-aaa"
    assert Allocation("ns", "p", "c", GPU, "GPU-aaa").uuid == "GPU-aaa"


# -- the mapping onto the GPUs ------------------------------------------------------------------------


def _gpus() -> tuple[DeviceFacts, ...]:
    return (
        DeviceFacts(index=0, uuid="GPU-aaa"),
        DeviceFacts(
            index=1,
            uuid="GPU-bbb",
            mig_devices=(MigDevice(0, "MIG-b0", 1, 0, "3g.40gb"), MigDevice(1, "MIG-b1", 2, 0, "3g.40gb")),
        ),
        DeviceFacts(index=2, uuid=None),  # NVML could not read its UUID: nothing can name it
    )


def test_pods_are_assigned_to_their_gpu_and_mig_device_by_uuid() -> None:
    allocations = [
        Allocation("ml", "train-0", "main", GPU, "GPU-aaa"),
        Allocation("ml", "train-1", "main", GPU, "GPU-aaa::1"),  # time-sliced replicas of one GPU
        Allocation("ml", "train-1", "main", GPU, "GPU-aaa::2"),  # the same container twice: once
        Allocation("ml", "infer-0", "main", MIG_RES, "MIG-b1"),
        Allocation("ml", "other", "main", GPU, "GPU-not-here"),  # not this node's (or NVML's) GPU
        Allocation("ml", "nic", "main", "example.com/nic", "0"),  # another plugin's device
    ]
    out = assign_pods(_gpus(), allocations)
    assert [d.index for d in out] == [0, 1, 2]
    assert out[0].pods == (PodHold("ml", "train-0", "main", GPU), PodHold("ml", "train-1", "main", GPU))
    assert out[1].pods == () and out[1].mig_devices[0].pods == ()
    assert out[1].mig_devices[1].pods == (PodHold("ml", "infer-0", "main", MIG_RES),)
    assert out[1].mig_devices[1].profile == "3g.40gb"  # the rest of the facts unchanged
    assert out[2].pods == ()
    # A reading with no allocations clears what an earlier one assigned.
    assert assign_pods(out, []) == _gpus()


def test_a_gpu_lists_at_most_max_pods_containers() -> None:
    many = [Allocation("ml", f"p-{i:03d}", "c", GPU, f"GPU-aaa::{i}") for i in range(MAX_PODS + 5)]
    pods = assign_pods(_gpus(), many)[0].pods
    assert len(pods) == MAX_PODS and pods[0].name == "p-000"


# -- one reading per sample: never raises ---------------------------------------------------------------


class FakeLister:
    def __init__(self, answer: bytes | Exception = b"") -> None:
        self.answer = answer
        self.calls = 0
        self.closed = False

    def list(self) -> bytes:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def close(self) -> None:
        self.closed = True


def test_a_failed_reading_is_reported_not_raised() -> None:
    lister = FakeLister(OSError("connect: permission denied"))
    reader = PodResourcesReader(lister)
    assert reader.read().status == PodResources(False, "connect: permission denied")
    lister.answer = b"\x0b"  # an answer that does not decode
    assert reader.read().status == PodResources(False, "field 1: wire type 3 is not read")
    lister.answer = response(pod("ml", "p", container("c", devices(GPU, "GPU-aaa"))))
    reading = reader.read()
    assert reading.status == PodResources(True) and reading.allocations[0].device_id == "GPU-aaa"


# -- the real port: gRPC on a unix socket ---------------------------------------------------------------


class Kubelet:
    """A gRPC server on a unix socket answering ``List`` as the kubelet does, bytes in, bytes out."""

    def __init__(self, path: Path, answer: bytes) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.release = threading.Event()  # set: a held call answers
        self.hold = False
        from concurrent import futures

        def list_pods(request: bytes, context: Any) -> bytes:
            self.requests.append(request)
            if self.hold:
                self.release.wait(30)
            return self.answer

        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(list_pods)}
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
        self.server.add_insecure_port(f"unix:{path}")
        self.server.start()

    def stop(self) -> None:
        self.release.set()
        self.server.stop(None)


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[Kubelet, Path]]:
    sock = tmp_path / "kubelet.sock"
    server = Kubelet(sock, response(pod("ml", "train-0", container("main", devices(GPU, "GPU-aaa")))))
    yield server, sock
    server.stop()


def test_the_kubelet_port_calls_list_over_the_unix_socket(kubelet: tuple[Kubelet, Path]) -> None:
    server, sock = kubelet
    port = KubeletPodResources(str(sock), timeout_s=10)
    try:
        assert decode_list_response(port.list()) == (Allocation("ml", "train-0", "main", GPU, "GPU-aaa"),)
        assert server.requests == [b""]  # ListPodResourcesRequest is empty
        assert LIST_METHOD == "/v1.PodResourcesLister/List"
    finally:
        port.close()


def test_a_call_the_kubelet_does_not_answer_times_out(kubelet: tuple[Kubelet, Path]) -> None:
    server, sock = kubelet
    server.hold = True
    port = KubeletPodResources(str(sock), timeout_s=0.3)
    try:
        with pytest.raises(OSError, match="DEADLINE_EXCEEDED"):
            port.list()
    finally:
        server.release.set()
        port.close()


def test_no_socket_is_an_error_naming_the_socket(tmp_path: Path) -> None:
    missing = tmp_path / "absent.sock"
    port = KubeletPodResources(str(missing), timeout_s=5)
    try:
        reading = PodResourcesReader(port).read()
    finally:
        port.close()
    assert not reading.status.available
    assert "UNAVAILABLE" in reading.status.error and str(missing) in reading.status.error


# -- into the report ---------------------------------------------------------------------------------


class MigSource:
    """Two GPUs, the second with MIG devices; no NVML."""

    def sample(self) -> DeviceSample:
        return DeviceSample(NvmlStatus(True), _gpus()[:2])

    def wait_events(self, timeout_s: float) -> SourceEvents:
        return SourceEvents()

    def close(self) -> None:
        pass


def _agent(lister: FakeLister | None) -> Agent:
    config = AgentConfig(node_name="node-a", metrics_port=0, boot_time=T)
    return Agent(config, NullTransport(), source=MigSource(), pod_resources=lister)


def _spec(agent: Agent) -> dict[str, Any]:
    return agent.builder.render(agent.sample_once(), T)


def test_each_sample_reports_the_pods_holding_each_gpu() -> None:
    lister = FakeLister(
        response(
            pod("ml", "train-0", container("main", devices(GPU, "GPU-aaa"))),
            pod("ml", "infer-0", container("main", devices(MIG_RES, "MIG-b0::1"))),
        )
    )
    spec = _spec(_agent(lister))
    assert spec["podResources"] == {"available": True}
    assert spec["devices"][0]["pods"] == [{"namespace": "ml", "name": "train-0", "container": "main", "resource": GPU}]
    assert "pods" not in spec["devices"][1]
    assert spec["devices"][1]["migDevices"][0]["pods"] == [
        {"namespace": "ml", "name": "infer-0", "container": "main", "resource": MIG_RES}
    ]
    # What the operator reads of it.
    report = parse_report({"metadata": {"name": "node-a"}, "spec": spec})
    assert report.pod_resources == PodResources(True)
    assert [p.name for p in report.holders(0)] == ["train-0"]
    assert [p.name for p in report.holders(1)] == ["infer-0"]
    assert lister.calls == 1


def test_a_socket_that_fails_leaves_the_rest_of_the_report_as_it_was() -> None:
    whole = _spec(_agent(None))
    assert "podResources" not in whole  # not configured: absent
    spec = _spec(_agent(FakeLister(OSError("connect: no such file"))))
    assert spec.pop("podResources") == {"available": False, "error": "connect: no such file"}
    assert spec.pop("observedTime") and whole.pop("observedTime")  # each its own sample's time
    assert spec == whole


def test_the_agent_closes_the_socket_s_channel_when_it_stops() -> None:
    lister = FakeLister()
    agent = _agent(lister)
    agent.run_once()
    assert lister.closed


def test_a_pod_that_starts_or_leaves_a_gpu_is_written_at_once() -> None:
    def snap(pods: tuple[PodHold, ...], status: PodResources | None = READ) -> Snapshot:
        return Snapshot(T, NvmlStatus(True), (DeviceFacts(index=0, uuid="GPU-aaa", pods=pods),), pod_resources=status)

    hold = (PodHold("ml", "train-0", "main", GPU),)
    assert facts_changed(snap(()), snap(hold))
    assert facts_changed(snap(hold), snap(()))
    assert not facts_changed(snap(hold), snap(hold))
    assert facts_changed(snap((), PodResources(True)), snap((), PodResources(False, "timeout")))
    assert facts_changed(snap((), None), snap((), PodResources(True)))
    # Only the wording of the error changed: no new fact (the next write carries it).
    assert not facts_changed(snap((), PodResources(False, "a")), snap((), PodResources(False, "b")))
    builder = ReportBuilder("node-a", AgentInfo("0.1.0", ("nvml",), T))
    assert builder.render(snap(hold, PodResources(False, "x" * 2000)), T)["podResources"]["error"].endswith("…")
