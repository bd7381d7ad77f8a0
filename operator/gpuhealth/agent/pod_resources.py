"""Which containers hold each GPU: the kubelet's pod-resources API, read over its unix socket.

The kubelet serves ``v1.PodResourcesLister`` (GA) on ``/var/lib/kubelet/pod-resources/kubelet.sock``:
``List`` answers every pod on the node with, per container, the device IDs each device plugin
allocated to it (``ContainerDevices{resource_name, device_ids}``). NVIDIA's device plugin names every
device by its UUID, a GPU's (``GPU-...``) or a MIG device's (``MIG-...``), whatever its
``DEVICE_ID_STRATEGY`` (which only changes what the container is told in ``NVIDIA_VISIBLE_DEVICES``),
with ``::<replica>`` appended when time-slicing or MPS shares it (k8s-device-plugin v0.17.4,
``internal/rm/devices.go``: ``dev.ID = uuid``, ``NewAnnotatedID``). So a device ID names a GPU or MIG
device of this node by UUID, once the suffix is off; IDs that name none (another plugin's devices) are
not the agent's business.

Three parts, each testable alone:

* :func:`decode_list_response`: the ``ListPodResourcesResponse`` bytes to one :class:`Allocation` per
  (container, device ID), by a small protobuf wire-format decoder (no generated code: four messages
  of ``api.proto`` are all that is read, by field number);
* :class:`KubeletPodResources`: the narrow port's real side, one gRPC ``List`` call with identity
  serializers and a deadline;
* :func:`assign_pods` and :class:`PodResourcesReader`: the pure mapping onto the sampled devices, and
  one reading per sample that never raises (a failure is ``available: false`` with the error).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from gpuhealth.agent.model import DeviceFacts
from gpuhealth.api.kubelet_health import device_uuid
from gpuhealth.api.report import PodHold, PodResources

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
DEFAULT_TIMEOUT_S = 3.0
# What one device or MIG device lists at most (the report CRD's maxItems); the rest are left out, with a warning.
MAX_PODS = 64
# The kubelet answers every pod of the node in one message: allow more than gRPC's default 4 MiB.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, order=True)
class Allocation:
    """One device ID a device plugin allocated to one container, as ``List`` answers it."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str

    @property
    def uuid(self) -> str:
        """The device's own ID: a time-sliced or MPS replica's ``::<n>`` taken off."""
        return device_uuid(self.device_id)


# -- the protobuf wire format (decoding only) --------------------------------------------------------


class WireError(ValueError):
    """Bytes that are not the message they should be."""


_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 64:
            raise WireError("varint longer than 10 bytes")


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """The fields of one message, in order: ``(number, value)``, a varint or fixed-width field's value
    as an int, a length-delimited one's (a string, bytes, a nested message, a packed list) as bytes.
    Groups (wire types 3 and 4, deprecated) and anything truncated raise :class:`WireError`."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise WireError(f"field {number}: {size} bytes announced, {len(buf) - pos} left")
            yield number, buf[pos : pos + size]
            pos += size
        elif wire in (_I64, _I32):
            width = 8 if wire == _I64 else 4
            if pos + width > len(buf):
                raise WireError(f"field {number}: truncated fixed-width value")
            yield number, int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        else:
            raise WireError(f"field {number}: wire type {wire} is not read")


def _text(value: int | bytes, where: str) -> str:
    if not isinstance(value, bytes):
        raise WireError(f"{where}: a string field sent as a number")
    return value.decode("utf-8", errors="replace")


def _message(value: int | bytes, where: str) -> bytes:
    if not isinstance(value, bytes):
        raise WireError(f"{where}: a message field sent as a number")
    return value


def decode_list_response(data: bytes) -> tuple[Allocation, ...]:
    """``ListPodResourcesResponse`` (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto) as one
    :class:`Allocation` per container and device ID, sorted. Read by field number::

        ListPodResourcesResponse{repeated PodResources pod_resources = 1}
        PodResources{string name = 1; string namespace = 2; repeated ContainerResources containers = 3}
        ContainerResources{string name = 1; repeated ContainerDevices devices = 2}
        ContainerDevices{string resource_name = 1; repeated string device_ids = 2}

    Every other field (CPUs, memory, topology, DRA claims) is skipped."""
    out: list[Allocation] = []
    for number, pod in fields(data):
        if number != 1:
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for n, v in fields(_message(pod, "pod_resources")):
            if n == 1:
                name = _text(v, "PodResources.name")
            elif n == 2:
                namespace = _text(v, "PodResources.namespace")
            elif n == 3:
                containers.append(_message(v, "PodResources.containers"))
        for container in containers:
            out.extend(_container(namespace, name, container))
    return tuple(sorted(out))


def _container(namespace: str, pod: str, data: bytes) -> Iterator[Allocation]:
    name = ""
    devices: list[tuple[str, list[str]]] = []
    for n, v in fields(data):
        if n == 1:
            name = _text(v, "ContainerResources.name")
        elif n == 2:
            resource, ids = "", []
            for m, w in fields(_message(v, "ContainerResources.devices")):
                if m == 1:
                    resource = _text(w, "ContainerDevices.resource_name")
                elif m == 2:
                    ids.append(_text(w, "ContainerDevices.device_ids"))
            devices.append((resource, ids))
    for resource, ids in devices:
        for device_id in ids:
            yield Allocation(namespace, pod, name, resource, device_id)


# -- the port: one List call -------------------------------------------------------------------------


class PodResourcesLister(Protocol):
    """Where the pods' devices come from: the kubelet's socket, or a fake in tests."""

    def list(self) -> bytes:
        """The raw ``ListPodResourcesResponse``; raises on any failure (a timeout included)."""
        ...

    def close(self) -> None: ...


class KubeletPodResources:
    """``v1.PodResourcesLister/List`` over the kubelet's unix socket, with a deadline of ``timeout_s``.

    The request (``ListPodResourcesRequest``) is empty and the answer is decoded here, so the method
    is called with identity serializers: no generated code. The channel is made once and reconnects
    by itself (a restarted kubelet recreates the socket)."""

    def __init__(self, socket_path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import grpc  # only an agent configured to read the socket loads gRPC

        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._grpc = grpc
        self._channel = grpc.insecure_channel(
            f"unix:{socket_path}", options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        )
        self._list = self._channel.unary_unary(LIST_METHOD, request_serializer=None, response_deserializer=None)

    def list(self) -> bytes:
        try:
            answer = self._list(b"", timeout=self.timeout_s)
        except self._grpc.RpcError as e:
            code = e.code() if callable(getattr(e, "code", None)) else None
            details = e.details() if callable(getattr(e, "details", None)) else str(e)
            name = getattr(code, "name", "ERROR")
            raise OSError(f"{LIST_METHOD} on {self.socket_path}: {name}: {details}") from None
        if not isinstance(answer, bytes):
            raise WireError(f"{LIST_METHOD} answered {type(answer).__name__}, not bytes")
        return answer

    def close(self) -> None:
        self._channel.close()


# -- the mapping onto the sampled devices -----------------------------------------------------------


def assign_pods(devices: Iterable[DeviceFacts], allocations: Iterable[Allocation]) -> tuple[DeviceFacts, ...]:
    """The devices with the containers holding each (``pods``), and each MIG device's, matched by UUID
    (a replica's ``::<n>`` off): each container once per GPU or MIG device and resource, sorted, at most
    :data:`MAX_PODS`. An ID that names none of them (another plugin's device, a GPU NVML does not list)
    is left out; a device nobody holds has none."""
    devices = tuple(devices)
    where: dict[str, tuple[int, int | None]] = {}
    for d in devices:
        if d.uuid:
            where[d.uuid] = (d.index, None)
        for m in d.mig_devices:
            if m.uuid:
                where[m.uuid] = (d.index, m.index)
    held: dict[tuple[int, int | None], set[PodHold]] = {}
    for a in allocations:
        target = where.get(a.uuid)
        if target is not None:
            held.setdefault(target, set()).add(PodHold(a.namespace, a.pod, a.container, a.resource))
    out = []
    for d in devices:
        migs = tuple(
            dataclasses.replace(m, pods=_bounded(held.get((d.index, m.index)), d, m.index)) for m in d.mig_devices
        )
        out.append(d.replace(pods=_bounded(held.get((d.index, None)), d, None), mig_devices=migs))
    return tuple(out)


def _bounded(holds: set[PodHold] | None, device: DeviceFacts, mig: int | None) -> tuple[PodHold, ...]:
    if not holds:
        return ()
    ordered = tuple(sorted(holds))
    if len(ordered) > MAX_PODS:
        what = f"GPU {device.index}" + (f" MIG device {mig}" if mig is not None else "")
        log.warning("%s is held by %d containers; the report names the first %d", what, len(ordered), MAX_PODS)
    return ordered[:MAX_PODS]


@dataclass(frozen=True)
class PodReading:
    """One reading of the socket: whether it answered, and what it allocated."""

    status: PodResources
    allocations: tuple[Allocation, ...] = ()


class PodResourcesReader:
    """Reads the kubelet's allocations once per sample; never raises. A failure (no socket, no
    permission, a timeout, an answer that does not decode) is ``available: false`` with the error, and
    no device's pods are known; the rest of the sample is unaffected."""

    def __init__(self, lister: PodResourcesLister) -> None:
        self.lister = lister
        self._last_error = ""

    def read(self) -> PodReading:
        try:
            allocations = decode_list_response(self.lister.list())
        except Exception as e:  # the reading is a fact like any other: its failure is reported, not raised
            error = str(e) or type(e).__name__
            if error != self._last_error:
                log.warning("cannot read the kubelet's pod resources: %s", error)
            self._last_error = error
            return PodReading(PodResources(False, error))
        if self._last_error:
            log.info("the kubelet's pod resources are readable again")
        self._last_error = ""
        return PodReading(PodResources(True), allocations)

    def close(self) -> None:
        self.lister.close()
