"""HTTP endpoint for Prometheus (``/metrics``) and the kubelet's liveness probe (``/healthz``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpuhealth.agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

HealthCheck = Callable[[], tuple[bool, str]]


class MetricsServer:
    """Serves the agent's registry and health on a background thread."""

    def __init__(self, metrics: AgentMetrics, health: HealthCheck, port: int, bind: str = "0.0.0.0") -> None:
        registry = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/livez"):
                    ok, message = health()
                    self._reply(200 if ok else 503, (message + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._reply(404, b"not found\n", "text/plain; charset=utf-8")

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s - %s", self.address_string(), format % args)

        self._httpd = ThreadingHTTPServer((bind, port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the kernel picks one when constructed with port 0)."""
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="gpuhealth-metrics", daemon=True)
        self._thread.start()
        log.info("serving /metrics and /healthz on port %d", self.port)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
