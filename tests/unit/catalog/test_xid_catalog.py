"""XID catalog: NVIDIA's facts (docs/xid-catalog.md), schema sanity, mapping rules, API edge cases, doc freshness."""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.catalog import xid
from gpuhealth.catalog.xid import (
    DEFAULT_ACTIONS,
    IMMEDIATE_ACTIONS,
    MAX_XID,
    XidEntry,
    all_entries,
    default_action,
    describe,
    is_application_error,
    lookup,
)

ROOT = Path(__file__).resolve().parents[3]

# NVIDIA's XID catalog (docs/xid-catalog.md): code -> immediate action.
DESIGN_IMMEDIATE = {
    13: "RESTART_APP",
    31: "RESTART_APP",
    43: "IGNORE",
    45: "IGNORE",  # ignore when other XIDs accompany it
    48: "RESET_GPU",
    62: "RESET_GPU",
    63: "IGNORE",
    64: "RESET_GPU",
    68: "RESTART_APP",
    74: "DECODE_MESSAGE",  # depends on register bits, contact support when persistent
    79: "REBOOT_NODE",
    92: "WATCH",  # "ignore (watch)"
    94: "RESTART_APP",
    95: "RESET_GPU",
    109: "RESET_GPU",
    119: "RESET_GPU",
    120: "RESET_GPU",
    140: "RESET_GPU",
    143: "RESET_GPU",
    154: "FOLLOW_RECOVERY_ACTION",
}

APP_ERRORS = (13, 31, 43, 45, 68, 94)
DEVICE_PLUGIN_SKIPPED = (13, 31, 43, 45, 68, 109)


def _raw() -> dict[str, Any]:
    text = resources.files("gpuhealth.catalog").joinpath("xid_catalog.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


# --- catalog facts -----------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "action"), sorted(DESIGN_IMMEDIATE.items()))
def test_design_codes_have_documented_immediate_action(code: int, action: str) -> None:
    entry = lookup(code)
    assert entry.known
    assert entry.immediate_action == action


@pytest.mark.parametrize("code", APP_ERRORS)
def test_application_errors(code: int) -> None:
    assert is_application_error(code)
    assert default_action(code) == "ignore"


@pytest.mark.parametrize("code", [48, 62, 64, 79, 95, 109, 119, 120, 140, 143])
def test_hardware_codes_are_not_application_errors(code: int) -> None:
    assert not is_application_error(code)


@pytest.mark.parametrize("code", [48, 64, 79, 95, 119, 120, 140, 143])
def test_drain_codes(code: int) -> None:
    assert default_action(code) == "drain"


@pytest.mark.parametrize(
    ("code", "action"),
    [(43, "ignore"), (45, "ignore"), (63, "ignore"), (92, "observe"), (74, "cordon"), (154, "observe")],
)
def test_specific_default_actions(code: int, action: str) -> None:
    assert default_action(code) == action


def test_109_follows_catalog_not_device_plugin() -> None:
    # The device plugin skips 109 by default; the catalog says reset the GPU.
    assert not is_application_error(109)
    assert default_action(109) == "drain"
    skipped_but_not_app = [c for c in DEVICE_PLUGIN_SKIPPED if not is_application_error(c)]
    assert skipped_but_not_app == [109]


def test_describe() -> None:
    assert describe(79) == "XID 79 (GPU has fallen off the bus): reboot the node"
    assert describe(48).startswith("XID 48 (Double-bit ECC error): ")
    assert describe(500) == "XID 500 (Unknown XID 500): contact support"


# --- unknown and out-of-range codes ---------------------------------------------------------


@pytest.mark.parametrize("code", [173, 200, 999, MAX_XID])
def test_unknown_codes(code: int) -> None:
    entry = lookup(code)
    assert not entry.known
    assert entry.code == code
    assert entry.name == f"Unknown XID {code}"
    assert entry.default_action == "observe"
    assert not entry.application_error
    assert entry not in all_entries()


@pytest.mark.parametrize("code", [0, -1, MAX_XID + 1, 10**9])
def test_out_of_range_raises(code: int) -> None:
    with pytest.raises(ValueError):
        lookup(code)
    with pytest.raises(ValueError):
        default_action(code)


@pytest.mark.parametrize("code", [True, 79.0, "79", None])
def test_non_int_raises(code: Any) -> None:
    with pytest.raises(ValueError):
        lookup(code)


@given(st.integers(min_value=1, max_value=MAX_XID))
def test_lookup_never_raises_in_range(code: int) -> None:
    entry = lookup(code)
    assert entry.code == code
    assert entry.default_action in DEFAULT_ACTIONS
    assert entry.immediate_action in IMMEDIATE_ACTIONS
    assert describe(code).startswith(f"XID {code} (")


# --- schema sanity and mapping rules --------------------------------------------------------


def test_json_schema() -> None:
    data = _raw()
    assert data["schema_version"] == 1
    fields = {f for f in XidEntry.__dataclass_fields__ if f != "known"}
    codes = []
    for raw in data["entries"]:
        assert set(raw) == fields, raw.get("code")
        assert isinstance(raw["code"], int) and 1 <= raw["code"] <= MAX_XID
        for key in ("name", "mnemonic", "description", "what_to_do"):
            assert isinstance(raw[key], str) and raw[key].strip(), (raw["code"], key)
        for key in ("application_error", "legacy", "inferred"):
            assert isinstance(raw[key], bool), (raw["code"], key)
        assert raw["immediate_action"] in IMMEDIATE_ACTIONS
        assert raw["default_action"] in DEFAULT_ACTIONS
        assert raw["description"].endswith(".") and raw["what_to_do"].endswith(".")
        assert "|" not in raw["description"] + raw["what_to_do"] + raw["name"]
        codes.append(raw["code"])
    assert len(codes) == len(set(codes)), "duplicate codes"
    assert codes == sorted(codes)


def test_catalog_covers_nvidia_range() -> None:
    entries = all_entries()
    assert [e.code for e in entries] == list(range(1, 173))
    assert all(e.known for e in entries)
    assert set(DESIGN_IMMEDIATE) <= {e.code for e in entries}


def test_names_are_unique() -> None:
    names = [e.name for e in all_entries()]
    assert len(names) == len(set(names))


def _expected_defaults(entry: XidEntry) -> set[str]:
    if entry.application_error:
        return {"ignore"}
    return {
        "IGNORE": {"ignore", "observe"},
        "WATCH": {"observe"},
        "RESTART_APP": {"observe"},
        "CONTACT_SUPPORT": {"observe"},
        "FOLLOW_RECOVERY_ACTION": {"observe"},
        "DECODE_MESSAGE": {"cordon"},
        "UPDATE_SOFTWARE": {"cordon"},
        "RESET_GPU": {"drain"},
        "REBOOT_NODE": {"drain"},
        "RESTART_VM": {"drain"},
        "CHECK_HARDWARE": {"repair"},
    }[entry.immediate_action]


def test_default_action_follows_mapping_rules() -> None:
    bad = [
        (e.code, e.immediate_action, e.default_action)
        for e in all_entries()
        if e.default_action not in _expected_defaults(e)
    ]
    assert bad == []


def test_application_errors_only_need_an_app_restart() -> None:
    for e in all_entries():
        if e.application_error:
            assert e.immediate_action in {"RESTART_APP", "IGNORE"}, e.code


def test_legacy_codes_are_low_key() -> None:
    for e in all_entries():
        if e.legacy:
            assert e.default_action in {"ignore", "observe"}, e.code


def test_all_entries_returns_a_copy() -> None:
    first = all_entries()
    first.clear()
    assert len(all_entries()) == 172
    assert lookup(79) is lookup(79)


def test_unknown_entries_use_known_vocabulary() -> None:
    assert xid.lookup(300).immediate_action in IMMEDIATE_ACTIONS


# --- generated doc --------------------------------------------------------------------------


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_xid_docs", ROOT / "hack" / "gen_xid_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doc_is_fresh() -> None:
    gen = _load_generator()
    doc = ROOT / "docs" / "xid-catalog.md"
    assert doc.read_text(encoding="utf-8") == gen.render(), "run: python hack/gen_xid_docs.py"
    assert gen.main(["--check"]) == 0


def test_check_detects_stale_doc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = _load_generator()
    stale = tmp_path / "xid-catalog.md"
    stale.write_text(gen.render().replace("| 79 |", "| 97 |", 1), encoding="utf-8")
    monkeypatch.setattr(gen, "DOC", stale)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0


def test_doc_lists_every_entry_and_the_109_note() -> None:
    text = (ROOT / "docs" / "xid-catalog.md").read_text(encoding="utf-8")
    for e in all_entries():
        assert f"\n| {e.code} | " in text, e.code
    assert "109" in text and "device plugin" in text
