"""The kubectl the tooling starts against a test cluster keeps its discovery cache in that cluster's
directory, never in the checkout.

kubectl and helm put it in ``$HOME/.kube/cache`` unless told otherwise; with HOME unset that is
``.kube/cache`` under the working directory, which for a test run is the repository (280 files of
one were once committed from there). The API server here is a stand-in that answers discovery only:
what kubectl caches is what is checked, not what a cluster does. helm and the documented uninstall
are checked on a real control plane (``tests/integration/test_chart_install.py``), where helm is
built.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from devkit.cluster import LocalCluster

DISCOVERY = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/version": {"major": "1", "minor": "37", "gitVersion": "v1.37.0"},
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node", "verbs": ["get", "list"]}
        ],
    },
}


class _Discovery(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = DISCOVERY.get(self.path.split("?")[0])
        data = json.dumps(body or {"kind": "Status", "code": 404}).encode()
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Discovery)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def cluster_at(workdir: Path, server: str) -> LocalCluster:
    workdir.mkdir()
    cluster = LocalCluster(workdir=workdir)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server}}],
        "users": [{"name": "admin", "user": {}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "local",
    }
    cluster.kubeconfig.write_text(json.dumps(config))
    return cluster


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory a run starts in, with HOME unset."""
    path = tmp_path / "checkout"
    path.mkdir()
    monkeypatch.chdir(path)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("KUBECACHEDIR", raising=False)
    return path


def cached_discovery(workdir: Path) -> list[Path]:
    return list(workdir.rglob("servergroups.json"))


def test_the_clusters_kubectl_caches_discovery_in_the_clusters_directory(
    tmp_path: Path, server: str, checkout: Path
) -> None:
    cluster = cluster_at(tmp_path / "cluster", server)

    assert "nodes" in cluster.kubectl("api-resources", "--no-headers").stdout

    assert not (checkout / ".kube").exists()
    assert cached_discovery(cluster.workdir), "kubectl cached no discovery at all"
