"""NvmlSource on a scripted NVML (scripted_nvml.py, behind the agent's NVML port): the cases the C fake
reaches only with a new scenario verb, each scripted at the one call that matters."""

from __future__ import annotations

import dataclasses
import logging

import pynvml
import pytest

from gpuhealth.agent.nvml_calls import GPU_FACT_READS
from gpuhealth.agent.nvml_source import Q_CLOCK, Q_POWER, Q_RECOVERY, NvmlSource
from gpuhealth.api.device_facts import GpuFacts
from gpuhealth.api.recovery import RecoveryAction
from tests.unit.agent.scripted_nvml import FI_RECOVERY_ACTION, ScriptedNvml, nvml_error


def _source(nvml: ScriptedNvml) -> NvmlSource:
    return NvmlSource(nvml=nvml)


def test_a_gpu_lost_mid_sample_is_reported_lost_with_its_last_facts_and_returns() -> None:
    nvml = ScriptedNvml(gpus=2)
    src = _source(nvml)
    healthy = src.sample().devices[1]
    assert not healthy.lost and healthy.power_w == 120.0
    # GPU 1 answers its temperature, then falls off the bus at the power reading.
    nvml.script("nvmlDeviceGetTemperature", 71, gpu=1)
    nvml.script("nvmlDeviceGetPowerUsage", nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST), gpu=1)
    calls_before = len(nvml.calls)
    first, lost = src.sample().devices
    assert not first.lost
    assert lost.lost and lost.uuid == "GPU-scripted-1" and lost.pci_bus_id == healthy.pci_bus_id
    # The half-read sample is abandoned: the facts are the last whole ones, not the new temperature.
    assert lost.temperature == healthy.temperature
    # Nothing after the lost call is asked of GPU 1 in that sample (GPU 0 was sampled first).
    assert nvml.calls[calls_before:][-1] == "nvmlDeviceGetPowerUsage"
    nvml.unscript("nvmlDeviceGetPowerUsage", gpu=1)
    back = src.sample().devices[1]
    assert not back.lost and back.temperature is not None and back.temperature.current_c == 71


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_SUPPORTED])
def test_a_driver_without_the_recovery_action_field_marks_it_unsupported_not_a_fault(code: int) -> None:
    nvml = ScriptedNvml(gpus=1)
    nvml.field_fails(0, FI_RECOVERY_ACTION, code)
    device = _source(nvml).sample().devices[0]
    assert not device.lost
    assert device.recovery_action is None
    assert Q_RECOVERY in device.unsupported
    assert device.power_w == 120.0  # the rest of the sample is read


def test_a_recovery_action_newer_than_the_table_is_omitted_as_unknown(caplog: pytest.LogCaptureFixture) -> None:
    newest = max(action.row.nvml for action in RecoveryAction)
    nvml = ScriptedNvml(gpus=1)
    nvml.fields[(0, FI_RECOVERY_ACTION)] = newest + 1
    src = _source(nvml)
    with caplog.at_level(logging.WARNING, logger="gpuhealth.agent.nvml_source"):
        device = src.sample().devices[0]
    assert device.recovery_action is None
    assert Q_RECOVERY not in device.unsupported and not device.lost
    assert f"GPU recovery action {newest + 1} is newer than this agent knows" in caplog.text
    nvml.fields[(0, FI_RECOVERY_ACTION)] = newest
    assert src.sample().devices[0].recovery_action is RecoveryAction.from_nvml(newest)


def test_a_binding_without_the_newer_names_falls_back_to_the_older_ones() -> None:
    """pynvml before the renames: no ``_v2`` CUDA version, no ``ClocksEventReasons`` (both answer
    FunctionNotFound); the older names are used, the clock one remembered, and neither
    query is unsupported."""
    nvml = ScriptedNvml(gpus=1)
    not_found = nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    nvml.script("nvmlSystemGetCudaDriverVersion_v2", not_found)
    nvml.script("nvmlSystemGetCudaDriverVersion", 12040)
    nvml.script("nvmlDeviceGetCurrentClocksEventReasons", not_found)
    nvml.script("nvmlDeviceGetCurrentClocksThrottleReasons", 0x4)
    src = _source(nvml)
    sample = src.sample()
    assert sample.status.cuda_version == "12.4"
    device = sample.devices[0]
    assert device.clock_event_reasons == 0x4 and Q_CLOCK not in device.unsupported
    src.sample()
    assert nvml.calls.count("nvmlDeviceGetCurrentClocksEventReasons") == 1
    assert nvml.calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 2


def test_a_power_reading_the_gpu_refuses_is_unsupported_and_the_gpu_stays_in_service() -> None:
    nvml = ScriptedNvml(gpus=1)
    nvml.script("nvmlDeviceGetPowerUsage", nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED))
    device = _source(nvml).sample().devices[0]
    assert device.power_w is None and Q_POWER in device.unsupported and not device.lost


def test_each_declared_gpu_fact_has_its_nvml_read() -> None:
    """A field of api/device_facts.py GpuFacts is read through agent/nvml_calls.py GPU_FACT_READS."""
    declared = {f.name for f in dataclasses.fields(GpuFacts)}
    assert set(GPU_FACT_READS) == declared, "GPU_FACT_READS and GpuFacts name different facts"


def test_a_corrupt_inforom_is_a_fact_and_a_refused_check_is_unsupported() -> None:
    nvml = ScriptedNvml(gpus=3)
    nvml.script("nvmlDeviceValidateInforom", nvml_error(pynvml.NVML_ERROR_CORRUPTED_INFOROM), gpu=1)
    nvml.script("nvmlDeviceValidateInforom", nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED), gpu=2)
    valid, corrupt, refused = _source(nvml).sample().devices
    assert valid.inforom_corrupt is False and "inforomCorrupt" not in valid.unsupported
    assert corrupt.inforom_corrupt is True and not corrupt.lost and corrupt.power_w == 120.0
    assert refused.inforom_corrupt is None and "inforomCorrupt" in refused.unsupported


def test_the_inforom_is_read_again_only_after_its_period() -> None:
    """It is read back from flash: at start, then once its period (an hour, as DCGM) has passed; a failed
    read is asked again at the next sample."""
    clock = [0.0]
    nvml = ScriptedNvml(gpus=1)
    src = NvmlSource(nvml=nvml, monotonic=lambda: clock[0])

    def reads() -> int:
        return nvml.calls.count("nvmlDeviceValidateInforom")

    assert src.sample().devices[0].inforom_corrupt is False and reads() == 1
    nvml.script("nvmlDeviceValidateInforom", nvml_error(pynvml.NVML_ERROR_CORRUPTED_INFOROM))
    clock[0] = 3599.0
    assert src.sample().devices[0].inforom_corrupt is False and reads() == 1  # the last answer stands
    clock[0] = 3600.0
    assert src.sample().devices[0].inforom_corrupt is True and reads() == 2
    nvml.script("nvmlDeviceValidateInforom", nvml_error(pynvml.NVML_ERROR_UNKNOWN))
    clock[0] = 7200.0
    assert src.sample().devices[0].inforom_corrupt is None and reads() == 3  # failed: unknown, not cached
    nvml.script("nvmlDeviceValidateInforom", nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED))
    clock[0] = 7201.0
    refused = src.sample().devices[0]
    assert refused.inforom_corrupt is None and "inforomCorrupt" in refused.unsupported and reads() == 4
    clock[0] = 7300.0
    again = src.sample().devices[0]
    assert "inforomCorrupt" in again.unsupported and reads() == 4  # the refusal stands too
