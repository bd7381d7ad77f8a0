"""The command line: explain (no cluster), usage errors, exit codes, one-line errors, colour decision."""

from __future__ import annotations

import io
import json

import pytest

from gpuhealth.cli import main as cli
from gpuhealth.cli.errors import Refused
from gpuhealth.cli.explain import explain, parse_code


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("text", ["79", "XID79", "xid79", "xid-79", "Xid 79", " 79 "])
def test_xid_codes_as_on_call_writes_them(text: str) -> None:
    assert parse_code(text) == 79


@pytest.mark.parametrize("text", ["0", "1024", "foo", "XID", "-1", "7.9"])
def test_bad_xid_codes_are_refused(text: str) -> None:
    with pytest.raises(Refused):
        parse_code(text)


def test_explain_needs_no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    code, out, err = _run("explain", "79")
    assert code == 0 and err == ""
    assert "GPU has fallen off the bus" in out and "REBOOT_NODE" in out and "drain" in out


def test_explain_json() -> None:
    code, out, _ = _run("explain", "XID48", "-o", "json")
    data = json.loads(out)
    assert (
        code == 0 and data["code"] == 48 and data["defaultAction"] == "drain" and data["immediateAction"] == "RESET_GPU"
    )
    assert any("63 or 64" in n for n in data["notes"])


def test_explain_unknown_and_application_codes() -> None:
    unknown = explain(900)
    assert not unknown["known"] and unknown["defaultAction"] == "observe"
    app = explain(31)
    assert app["applicationError"] and any("RepeatedAppXID" in n for n in app["notes"])
    assert any("recovery action" in n for n in explain(154)["notes"])


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["explain"],
        ["explain", "0"],
        ["status", "-o", "yaml"],
        ["resume", "p", "--mode", "Paused"],
        ["describe"],
        ["status", "--request-timeout", "soon"],
    ],
)
def test_usage_errors_exit_2_with_one_line(argv: list[str]) -> None:
    code, out, err = _run(*argv)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1


def test_missing_credentials_are_an_api_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    code, out, err = _run("status")
    assert code == 1 and out == ""
    assert err.startswith("error: cannot load Kubernetes credentials from /nonexistent/kubeconfig")
    assert err.count("\n") == 1


def test_connection_flags_work_before_and_after_the_command() -> None:
    p = cli.build_parser()
    a = p.parse_args(["--kubeconfig", "/a", "status", "--context", "c"])
    assert a.kubeconfig == "/a" and a.context == "c"
    b = p.parse_args(["status", "--kubeconfig", "/b", "--request-timeout", "5s"])
    assert b.kubeconfig == "/b" and b.request_timeout == 5.0
    assert not hasattr(p.parse_args(["status"]), "kubeconfig")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_tty_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    args = cli.build_parser().parse_args(["explain", "79"])
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert cli.Context(args, _Tty(), io.StringIO()).color
    assert not cli.Context(args, io.StringIO(), io.StringIO()).color
    monkeypatch.setenv("NO_COLOR", "1")
    assert not cli.Context(args, _Tty(), io.StringIO()).color
