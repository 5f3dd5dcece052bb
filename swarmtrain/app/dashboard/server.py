"""The dashboard's web server (stdlib ``http.server``): the page at ``/``, its data at ``/api/state``.

Read-only and local: GET only, no external assets (the page is one self-contained document, and a
Content-Security-Policy header forbids it from loading anything but ``/api/state`` from itself).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from swarmtrain.app.dashboard.page import PAGE
from swarmtrain.core.jsonsafe import dumps

__all__ = ["DashboardServer", "CSP"]

logger = logging.getLogger(__name__)

CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
)


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "swarmtrain-dashboard"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", PAGE.encode())
        elif path == "/api/state":
            self._send(200, "application/json", dumps(self.server.state()).encode())
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def do_HEAD(self) -> None:  # noqa: N802
        self._send(405, "text/plain; charset=utf-8", b"")

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        logger.debug("%s %s", self.address_string(), format % args)


class DashboardServer(ThreadingHTTPServer):
    """Serves the page and ``state()`` (a JSON-able dict) as ``/api/state``.

    Binds at construction (``port=0``: any free port; :attr:`url` tells which); :meth:`start` serves
    in a daemon thread, :meth:`close` stops and releases the port.

    Raises:
        OSError: the address cannot be bound (in use, no such host...).
    """

    daemon_threads = True

    def __init__(self, host: str, port: int, state: Callable[[], dict[str, Any]]) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)
        self.state = state
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port/`` as bound (IPv6 hosts in brackets)."""
        host, port = self.server_address[0], self.server_address[1]
        host = str(host)
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"

    def start(self) -> None:
        """Serve requests in a daemon thread."""
        self._thread = threading.Thread(
            target=self.serve_forever, name="swarmtrain-dashboard-http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving (if started) and close the socket."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(5.0)
        self.server_close()
