"""The NVML port declares exactly the NVML calls the agent makes, each one pynvml has.

Parses the agent's modules: every ``nvml.<fn>`` / ``self._nvml.<fn>`` / ``pynvml.<fn>`` use and every
NVML function named in a string (looked up with getattr) must be a member of the Protocol, every
member must be used, and every member must be a pynvml function taking the same arguments, so the
port can drift from neither the readers nor the binding.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pynvml

from gpuhealth.agent import nvml_port
from gpuhealth.agent.nvml_port import Nvml, PynvmlNvml

AGENT = Path(nvml_port.__file__).resolve().parent
_NAME = re.compile(r"^nvml[A-Z]\w*$")


def _is_function(name: str) -> bool:
    return bool(_NAME.match(name)) and callable(getattr(pynvml, name, None))


def _receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def agent_uses() -> dict[str, set[str]]:
    """NVML functions the agent's modules (the port itself aside) name, by how they reach them."""
    uses: dict[str, set[str]] = {"port": set(), "pynvml": set(), "string": set()}
    for path in sorted(AGENT.glob("*.py")):
        if path.name == "nvml_port.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _is_function(node.attr):
                receiver = _receiver(node.value)
                if receiver in ("nvml", "self._nvml"):
                    uses["port"].add(node.attr)
                elif receiver == "pynvml":
                    uses["pynvml"].add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_function(node.value):
                uses["string"].add(node.value)
    return uses


def protocol_members() -> set[str]:
    return {name for name in vars(Nvml) if name.startswith("nvml")}


def test_the_scan_finds_the_agents_calls() -> None:
    uses = agent_uses()
    # A floor, so a broken scan cannot pass vacuously: one call from each reader module.
    assert {
        "nvmlInit",
        "nvmlDeviceGetFieldValues",
        "nvmlEventSetWait",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetMigDeviceHandleByIndex",
    } <= uses["port"]
    assert {"nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"} <= uses["string"]


def test_the_agent_reaches_nvml_only_through_the_port() -> None:
    assert agent_uses()["pynvml"] == set(), "call NVML through the Nvml port (agent/nvml_port.py)"


def test_the_protocol_declares_exactly_the_calls_the_agent_makes() -> None:
    uses = agent_uses()
    used = uses["port"] | uses["string"]
    members = protocol_members()
    assert sorted(used - members) == [], "the agent calls NVML functions the Nvml port does not declare"
    assert sorted(members - used) == [], "the Nvml port declares NVML functions the agent no longer calls"


def test_every_member_is_a_pynvml_function_with_the_same_arguments() -> None:
    for name in sorted(protocol_members()):
        binding = getattr(pynvml, name, None)
        assert callable(binding), f"pynvml has no {name}"
        ours = [p for p in inspect.signature(getattr(Nvml, name)).parameters if p != "self"]
        theirs = [
            p.name
            for p in inspect.signature(binding).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        assert len(ours) == len(theirs), f"{name}: the port takes {ours}, pynvml {theirs}"


def test_the_adapter_implements_every_member() -> None:
    adapter = set(vars(PynvmlNvml))
    assert sorted(protocol_members() - adapter) == []
