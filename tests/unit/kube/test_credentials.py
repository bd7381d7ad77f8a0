"""The one credential chain: KUBECONFIG as a list of files, merged in order, as kubectl does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from kubernetes import config

from gpuhealth.controller.process.handlers import connection_info
from gpuhealth.kube import credentials


def _split_kubeconfig(tmp_path: Path) -> tuple[Path, Path]:
    """Cluster and context in one file, the user in another: neither works alone."""
    a = tmp_path / "clusters.yaml"
    b = tmp_path / "users.yaml"
    a.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://example.test:6443"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    b.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "users": [{"name": "u", "user": {"token": "t0k"}}]}))
    return a, b


def test_kubeconfig_env_list_is_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _split_kubeconfig(tmp_path)
    monkeypatch.setenv("KUBECONFIG", f"{a}{os.pathsep}{tmp_path / 'missing.yaml'}{os.pathsep}{b}")
    cfg = credentials.load(in_cluster_first=False)
    assert cfg.host == "https://example.test:6443"
    assert connection_info(cfg).token == "t0k"
    # The operator and the agent prefer in-cluster; outside a pod they fall back to the same list.
    assert credentials.load().host == "https://example.test:6443"


def test_explicit_kubeconfig_list_is_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _split_kubeconfig(tmp_path)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    cfg = credentials.load(f"{a}{os.pathsep}{b}")
    info = connection_info(cfg)
    assert (info.server, info.token, info.scheme) == ("https://example.test:6443", "t0k", "Bearer")


def test_no_credentials_anywhere_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nothing-here"))
    with pytest.raises(config.ConfigException):
        credentials.load()


def test_each_component_names_itself_to_the_api_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where a write sets no field manager, the API server takes the User-Agent's first part: the
    # operator's Node patches are then owned by gpuhealth-operator in managedFields, not by the
    # client library's default (OpenAPI-Generator), which any Python client would share.
    a, b = _split_kubeconfig(tmp_path)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    named = credentials.api_client(f"{a}{os.pathsep}{b}", user_agent="gpuhealth-operator")
    assert named.user_agent == "gpuhealth-operator"
    assert named.default_headers["User-Agent"] == "gpuhealth-operator"
    plain = credentials.api_client(f"{a}{os.pathsep}{b}")
    assert plain.user_agent.startswith("OpenAPI-Generator/")
