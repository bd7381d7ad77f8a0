"""DCGM exporter input: parsing, host filtering, XID change detection, merging, and the agent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuhealth.agent.dcgm_source import DcgmSource, XidChangeDetector, merge_dcgm, parse_dcgm_metrics
from gpuhealth.agent.model import DeviceFacts, Temperature
from gpuhealth.api.fabric import FABRIC_STATES
from tests.unit.agent.agent_testlib import AgentFactory, Scenario, device, wait_for

UUID0 = "GPU-9e3779b1-fa4e-4a1b-9c2d-000000001111"  # the fake NVML's GPU 0
UUID1 = "GPU-3c6ef362-fa4e-4a1b-9c2d-000000002222"


def exporter_text(
    host_label: str = "Hostname",
    host: str = "gpu-node-1",
    xid: tuple[int, int] = (0, 0),
    temp: int = 41,
    extra: str = "",
) -> str:
    """A dcgm-exporter style page for two GPUs; ``xid`` is (GPU 0's, GPU 1's) last XID."""

    def labels(gpu: int, uuid: str, more: str = "") -> str:
        return (
            f'gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",device="nvidia{gpu}",'
            f'modelName="NVIDIA H100 80GB HBM3",{host_label}="{host}"{more}'
        )

    lines = [
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
        f"DCGM_FI_DEV_GPU_TEMP{{{labels(0, UUID0)}}} {temp}",
        f"DCGM_FI_DEV_GPU_TEMP{{{labels(1, UUID1)}}} 39",
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
    ]
    for gpu, (uuid, code) in enumerate(((UUID0, xid[0]), (UUID1, xid[1]))):
        err_code = f',err_code="{code}"'
        lines.append(f"DCGM_FI_DEV_XID_ERRORS{{{labels(gpu, uuid, err_code)}}} {code}")
    lines += [
        "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter",
        f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{labels(0, UUID0)}}} 2",
        "# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge",
        f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{labels(0, UUID0)}}} 1",
        "# TYPE DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS counter",
        f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{labels(0, UUID0)}}} 5",
        "# TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASONS gauge",
        f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels(0, UUID0)}}} 64",
        "# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge",
        f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{labels(1, UUID1)}}} 8",
        "# TYPE DCGM_FI_DEV_SM_CLOCK gauge",
        f"DCGM_FI_DEV_SM_CLOCK{{{labels(0, UUID0)}}} 1980",
    ]
    return "\n".join(lines) + "\n" + extra


class Exporter:
    """A local HTTP server standing in for dcgm-exporter; ``body`` can change between scrapes."""

    def __init__(self) -> None:
        self.body = exporter_text()
        self.status = 200
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                payload = exporter.body.encode()
                self.send_response(exporter.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    server = Exporter()
    yield server
    server.close()


@pytest.mark.parametrize("host_label", ["Hostname", "hostname"])
def test_parses_both_host_label_spellings(host_label: str) -> None:
    gpus = parse_dcgm_metrics(exporter_text(host_label=host_label), "gpu-node-1")
    assert sorted(gpus) == [0, 1]
    facts = gpus[0].facts()
    assert facts.uuid == UUID0 and facts.model == "NVIDIA H100 80GB HBM3"
    assert facts.pci_bus_id == "00000000:18:00.0"
    assert facts.temperature == Temperature(41, None, None)
    assert facts.ecc is not None and facts.ecc.volatile_uncorrected == 2
    assert facts.remapped_rows is not None
    assert (facts.remapped_rows.failure, facts.remapped_rows.uncorrected) == (True, 5)
    assert facts.clock_event_reasons == 64
    assert gpus[1].facts().clock_event_reasons == 8  # older metric name


def test_filters_other_hosts() -> None:
    mixed = exporter_text(host="gpu-node-1") + exporter_text(host="gpu-node-2", temp=99)
    gpus = parse_dcgm_metrics(mixed, "gpu-node-1")
    assert gpus[0].facts().temperature == Temperature(41, None, None)
    # One host under another name (the exporter pod's hostname) is still this node.
    assert sorted(parse_dcgm_metrics(exporter_text(host="dcgm-exporter-x7k2p"), "gpu-node-1")) == [0, 1]
    # Several hosts and none is us: nothing is trusted.
    assert parse_dcgm_metrics(exporter_text(host="a") + exporter_text(host="b"), "gpu-node-1") == {}


def test_xid_detected_by_change_of_last_xid() -> None:
    detector = XidChangeDetector()
    now = datetime(2026, 11, 30, tzinfo=UTC)

    def events(xids: tuple[int, int]) -> list[tuple[int, int | None, bool]]:
        gpus = parse_dcgm_metrics(exporter_text(xid=xids), "gpu-node-1")
        return [(e.xid, e.gpu, baseline) for e, baseline in detector.update(gpus, now)]

    assert events((0, 0)) == []
    assert events((0, 0)) == []
    assert events((79, 0)) == [(79, 0, False)]
    assert events((79, 0)) == []  # the gauge keeps showing the last XID: not a new one
    assert events((48, 13)) == [(48, 0, False), (13, 1, False)]
    fresh = XidChangeDetector()
    gpus = parse_dcgm_metrics(exporter_text(xid=(31, 0)), "gpu-node-1")
    assert [(e.xid, baseline) for e, baseline in fresh.update(gpus, now)] == [(31, True)]


def test_xid_from_value_when_err_code_label_is_absent() -> None:
    text = '# TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{gpu="2",UUID="GPU-x"} 94\n'
    gpus = parse_dcgm_metrics(text)
    assert gpus[2].xid == 94


def test_merge_fills_only_what_nvml_lacks() -> None:
    nvml = (
        DeviceFacts(index=0, uuid=UUID0, temperature=Temperature(50, 87, 92), unsupported=("remappedRows",)),
        DeviceFacts(index=1, uuid=UUID1, temperature=Temperature(None, 87, 92)),
    )
    dcgm = {i: g.facts() for i, g in parse_dcgm_metrics(exporter_text(), "gpu-node-1").items()}
    merged = merge_dcgm(nvml, dcgm)
    assert merged[0].temperature == Temperature(50, 87, 92)  # NVML wins
    assert merged[0].remapped_rows is not None and merged[0].remapped_rows.failure is True
    assert merged[1].temperature == Temperature(39, 87, 92)


def test_source_fetches_and_reports_errors(exporter: Exporter) -> None:
    source = DcgmSource(exporter.url, "gpu-node-1", timeout_s=2)
    sample = source.sample()
    assert sample.error is None and sorted(sample.devices) == [0, 1]
    exporter.body = exporter_text(xid=(0, 79))
    assert [(e.xid, e.gpu, e.source) for e, _ in source.sample().xids] == [(79, 1, "dcgm")]
    exporter.status = 500
    failed = source.sample()
    assert failed.error is not None and failed.devices == {}


def test_agent_reports_dcgm_xids_and_facts(make_agent: AgentFactory, scenario: Scenario, exporter: Exporter) -> None:
    scenario.write("gpu 0 notsupported remapped_rows")
    _agent, api = make_agent(dcgm_url=exporter.url, interval_s=0.1)
    wait_for(lambda: api.writes())
    assert api.spec["agent"]["sources"] == ["nvml", "dcgm"]
    assert device(api.spec, 0)["remappedRows"]["failure"] is True  # from DCGM, NVML said NotSupported
    exporter.body = exporter_text(xid=(0, 79))
    wait_for(lambda: api.spec.get("xidEvents"))
    (event,) = api.spec["xidEvents"]
    assert (event["xid"], event["gpu"], event["uuid"], event["source"]) == (79, 1, UUID1, "dcgm")


def _fabric_page(manager_status: int, gen: int = 5, clock: int = 0) -> str:
    labels = f'gpu="0",UUID="{UUID0}",Hostname="gpu-node-1"'
    return "\n".join(
        [
            f"DCGM_FI_DEV_FABRIC_MANAGER_STATUS{{{labels}}} {manager_status}",
            f"DCGM_FI_DEV_FABRIC_CLIQUE_ID{{{labels}}} 7",
            f"DCGM_FI_DEV_FABRIC_HEALTH_MASK{{{labels}}} {0x1A9}",
            f"DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY{{{labels}}} 3",
            f"DCGM_FI_DEV_PCIE_LINK_GEN{{{labels}}} {gen}",
            f"DCGM_FI_DEV_PCIE_LINK_WIDTH{{{labels}}} 8",
            f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{labels}}} 4",
            f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels}}} {clock}",
            "",
        ]
    )


@pytest.mark.parametrize(("status", "state", "probe"), [(3, 3, 0), (4, 3, 999), (1, 1, None), (0, 0, None)])
def test_the_exporters_fabric_fields_are_the_nvml_facts(status: int, state: int, probe: int | None) -> None:
    facts = parse_dcgm_metrics(_fabric_page(status), "gpu-node-1")[0].facts()
    assert facts.fabric is not None and (facts.fabric.state, facts.fabric.status) == (FABRIC_STATES[state], probe)
    if state:
        assert (facts.fabric.clique_id, facts.fabric.health_mask, facts.fabric.health_summary) == (
            7,
            0x1A9,
            "LimitedCapacity",
        )
    assert facts.pcie is not None and (facts.pcie.width, facts.pcie.generation, facts.pcie.replays) == (8, 5, 4)
    # Unrecognized / NVML too old say nothing about the fabric.
    assert parse_dcgm_metrics(_fabric_page(6), "gpu-node-1")[0].facts().fabric is None


def test_the_exporters_pcie_generation_is_the_busy_one(monkeypatch: pytest.MonkeyPatch) -> None:
    source = DcgmSource("http://unused", "gpu-node-1")
    pages = iter([_fabric_page(3, gen=5, clock=0), _fabric_page(3, gen=1, clock=0x1)])
    monkeypatch.setattr(source, "fetch", lambda: next(pages))
    busy, idle = source.sample().devices[0], source.sample().devices[0]
    assert busy.pcie is not None and busy.pcie.generation == 5
    assert idle.pcie is not None and idle.pcie.generation == 5  # the idle gen1 is no fact
    merged = merge_dcgm((DeviceFacts(index=0, uuid=UUID0),), {0: idle})[0]
    assert merged.fabric == idle.fabric and merged.pcie == idle.pcie
