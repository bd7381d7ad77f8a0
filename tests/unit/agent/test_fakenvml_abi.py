"""The fake NVML cannot drift from NVIDIA's: its build, its own type copy and the agent's calls are
checked against the real ``nvml.h`` (the ``nvidia-nvml-dev`` wheel of the test extra).

The fake stands in for the driver in every agent test. A layout or prototype that differs from
NVIDIA's would let the agent pass here and misread a real GPU, so these tests make the header the
arbiter: the fake compiles against it, its fallback copy of the types is asserted equal to it, and
every NVML function the agent reaches through pynvml must be declared in it and exported by the fake.
"""

from __future__ import annotations

import ast
import ctypes
import inspect
import re
import shutil
import subprocess
from pathlib import Path

import pynvml
import pytest

from devkit import nvidia_plugins
from devkit.fakenvml import build as fakenvml
from gpuhealth.agent.nvml_port import Nvml

ROOT = Path(__file__).resolve().parents[3]
FAKE_DIR = ROOT / "devkit" / "fakenvml"
# pynvml's exception type turns a return code into text through this C function.
IMPLICIT = {"nvmlErrorString"}


@pytest.fixture(scope="module")
def include() -> Path:
    found = fakenvml.find_nvml_include()
    assert found is not None, "nvml.h not found: install the test extra (pip install -e '.[test]': nvidia-nvml-dev)"
    return Path(found)


@pytest.fixture(scope="module")
def header(include: Path) -> str:
    return (include / "nvml.h").read_text(errors="replace")


def _cc() -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc is not None, "these checks compile C: install gcc"
    return cc


def test_the_fake_compiles_against_nvidias_header(include: Path, tmp_path: Path) -> None:
    """Every exported function must match a prototype of nvml.h (-Wmissing-prototypes -Werror)."""
    flags = fakenvml.compile_flags(include)
    assert "-DFAKENVML_WITH_NVML_H" in flags and "-Wmissing-prototypes" in flags
    run = subprocess.run(
        [_cc(), *flags, "-o", str(tmp_path / "fake.so"), str(fakenvml.SOURCE)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr


def test_the_fakes_own_types_equal_nvidias(include: Path) -> None:
    """fakenvml_types.h (used without the header) has NVIDIA's sizes, offsets and values."""
    run = subprocess.run(
        [_cc(), "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-I{include}", str(FAKE_DIR / "abi_check.c")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr


def test_the_abi_check_covers_every_type_and_constant_of_the_copy() -> None:
    copy = (FAKE_DIR / "fakenvml_types.h").read_text()
    check = (FAKE_DIR / "abi_check.c").read_text()
    types = set(re.findall(r"[}*]\s*O_\((\w+)\);", copy))
    constants = set(re.findall(r"O_\((\w+)\)\s*=", copy))
    assert {"nvmlPciInfo_t", "nvmlEventData_t", "nvmlFieldValue_t", "nvmlDevice_t"} <= types
    assert {t for t in types if f"SAME_SIZE({t});" not in check} == set()
    assert {c for c in constants if f"SAME_VALUE({c});" not in check} == set()


def test_the_fake_without_the_header_still_builds(tmp_path: Path) -> None:
    run = subprocess.run(
        [_cc(), *fakenvml.compile_flags(None), "-o", str(tmp_path / "own.so"), str(fakenvml.SOURCE)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr


def test_the_test_build_uses_the_header(fake_nvml_lib: Path, include: Path) -> None:
    """The library every agent test loads is the header-checked build (not the fallback copy)."""
    assert fakenvml.compile_flags(fakenvml.find_nvml_include()) == fakenvml.compile_flags(include)
    assert fake_nvml_lib.exists()


def _pynvml_functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(pynvml))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _c_symbols(name: str, funcs: dict[str, ast.FunctionDef], seen: set[str] | None = None) -> set[str]:
    """The C functions a pynvml wrapper resolves (``_nvmlGetFunctionPointer("nvml...")``), following
    calls into other wrappers (``nvmlInit`` -> ``nvmlInitWithFlags``)."""
    seen = set() if seen is None else seen
    if name in seen or name not in funcs:
        return set()
    seen.add(name)
    out: set[str] = set()
    for node in ast.walk(funcs[name]):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "_nvmlGetFunctionPointer" and node.args and isinstance(node.args[0], ast.Constant):
            out.add(str(node.args[0].value))
        elif node.func.id in funcs:
            out |= _c_symbols(node.func.id, funcs, seen)
    return out


def agent_nvml_calls() -> set[str]:
    """pynvml functions the agent calls: the members of its NVML port (test_nvml_port.py proves the
    port declares exactly the calls the agent's readers make)."""
    funcs = _pynvml_functions()
    return {n for n in vars(Nvml) if n.startswith("nvml") and n in funcs}


def agent_c_symbols() -> set[str]:
    funcs = _pynvml_functions()
    symbols = set(IMPLICIT)
    for name in agent_nvml_calls():
        found = _c_symbols(name, funcs)
        assert found, f"pynvml.{name} resolves no NVML C function"
        symbols |= found
    return symbols


def test_the_agent_calls_are_found() -> None:
    calls = agent_nvml_calls()
    # A sanity floor, so a broken scan cannot pass vacuously.
    assert {"nvmlInit", "nvmlDeviceGetFieldValues", "nvmlEventSetWait", "nvmlDeviceRegisterEvents"} <= calls
    assert {"nvmlInitWithFlags", "nvmlEventSetWait_v2", "nvmlDeviceGetPciInfo_v3"} <= agent_c_symbols()


def test_every_nvml_function_the_agent_calls_is_in_nvidias_header(header: str) -> None:
    missing = sorted(s for s in agent_c_symbols() if not re.search(rf"\b{s}\s*\(", header))
    assert missing == [], f"the agent reaches NVML functions nvml.h does not declare: {missing}"


def test_every_nvml_function_the_agent_calls_is_exported_by_the_fake(fake_nvml_lib: Path) -> None:
    lib = ctypes.CDLL(str(fake_nvml_lib))
    missing = sorted(s for s in agent_c_symbols() if not hasattr(lib, s))
    assert missing == [], f"the fake NVML does not export {missing}"


def test_every_nvml_function_nvidias_device_plugin_and_gfd_call_is_nvidias_and_exported_by_the_fake(
    fake_nvml_lib: Path, header: str
) -> None:
    """NVIDIA's device plugin and GPU Feature Discovery run on the fake on the real node
    (tests/integration/test_device_plugin.py): go-nvml binds each call at its first use, and a symbol the
    fake lacks kills them there. Each call they make is NVIDIA's and the fake exports it."""
    calls = nvidia_plugins.NVML_CALLS
    assert {"nvmlDeviceGetHandleByUUID", "nvmlDeviceGetGpuFabricInfo", "nvmlDeviceRegisterEvents"} <= calls
    assert sorted(s for s in calls if not re.search(rf"\b{s}\s*\(", header)) == []
    lib = ctypes.CDLL(str(fake_nvml_lib))
    assert sorted(s for s in calls if not hasattr(lib, s)) == []


def test_a_blocked_call_waits_until_the_scenario_lets_it_go(
    fake_nvml_lib: Path, header: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``block <symbol>``: the function never returns while the scenario names it (a wedged GPU), other
    calls still answer, and the call goes on once the line is gone. The symbol is NVIDIA's."""
    import threading

    symbol = "nvmlDeviceGetTotalEccErrors"
    assert re.search(rf"\b{symbol}\s*\(", header) and symbol in agent_c_symbols()
    scenario = tmp_path / "scenario"
    scenario.write_text(f"block {symbol}\n")
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario))
    lib = ctypes.CDLL(str(fake_nvml_lib))
    assert lib.nvmlInitWithFlags(0) == 0
    try:
        handle = ctypes.c_void_p()
        assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
        count = ctypes.c_ulonglong(99)
        result: list[int] = []
        call = threading.Thread(
            target=lambda: result.append(lib.nvmlDeviceGetTotalEccErrors(handle, 1, 0, ctypes.byref(count))),
            daemon=True,
        )
        call.start()
        call.join(0.5)
        assert call.is_alive() and result == [], "the blocked call returned"
        temp = ctypes.c_uint()
        assert lib.nvmlDeviceGetTemperature(handle, 0, ctypes.byref(temp)) == 0  # others still answer
        tmp = tmp_path / "scenario.tmp"
        tmp.write_text("# unblocked\n")
        tmp.replace(scenario)
        call.join(5)
        assert result == [0] and count.value == 0
    finally:
        lib.nvmlShutdown()
