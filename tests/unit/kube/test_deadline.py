"""A request the API never answers fails at its deadline instead of holding a reconcile forever, and
a response whose body nobody needs goes back to the pool: through the real Kubernetes client against
a local socket that accepts and then says nothing (or answers once, keeping the connection alive)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client

from gpuhealth.kube.client import Kube
from gpuhealth.kube.deadline import bounded

NODE = b'{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"}}'


class Server:
    """Accepts connections; ``answer`` False: reads the request and never replies."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        with conn:
            while True:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")),
                    0,
                )
                while len(body) < length:
                    body += conn.recv(65536)
                if not self.answer:
                    time.sleep(30)
                    return
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(NODE)}\r\n\r\n".encode()
                    + NODE
                )


@pytest.fixture
def silent() -> Iterator[Server]:
    s = Server(answer=False)
    yield s
    s.sock.close()


def api(port: int) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    cfg.retries = False
    return client.ApiClient(cfg)


def test_a_request_the_api_never_answers_fails_at_its_deadline(silent: Server) -> None:
    kube = Kube(bounded(api(silent.port), connect_s=1.0, read_s=0.5))
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        kube.patch_node_status("n1", {"status": {"conditions": []}})
    assert time.monotonic() - started < 5.0


def test_an_explicit_timeout_is_kept(silent: Server) -> None:
    kube = Kube(bounded(api(silent.port), connect_s=1.0, read_s=30.0))
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        kube.core.read_node("n1", _request_timeout=(1.0, 0.3))
    assert time.monotonic() - started < 5.0


def test_unread_responses_go_back_to_the_pool() -> None:
    server = Server(answer=True)
    try:
        kube = Kube(bounded(api(server.port)))
        for _ in range(5):
            kube.patch_node_status("n1", {"status": {"conditions": []}})
            kube.evict_pod("ns", "p", "uid-1")
            kube.delete_device_taint_rule("r", "uid-2")
        assert server.connections == 1, "every call reused the one kept-alive connection"
    finally:
        server.sock.close()
