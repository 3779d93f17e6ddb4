"""A small web server for the status page: ``/`` the page (one self-contained HTML file, no outside assets),
``/api/swarm`` the watch's JSON snapshot, which the page fetches every few seconds."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable

log = logging.getLogger(__name__)

# the page draws peer-written strings with textContent only; this policy forbids anything else on top
_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _page() -> bytes:
    return resources.files("gradnode.node.status").joinpath("page.html").read_bytes()


class StatusServer:
    """Serves the page and ``snapshot()`` as JSON on ``host:port`` (port 0: any free one, see ``port``)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], host: str, port: int) -> None:
        page = _page()

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a client that sends half a request holds its thread at most this long

            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                path = self.path.split("?", 1)[0]
                if path == "/":
                    self._send(200, "text/html; charset=utf-8", page)
                elif path == "/api/swarm":
                    self._send(200, "application/json", json.dumps(snapshot()).encode())
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found\n")

            def _send(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("Content-Security-Policy", _CSP)
                self.send_header("X-Content-Type-Options", "nosniff")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("status page: " + fmt, *args)

        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as err:
            raise ValueError(f"status page: cannot listen on {host}:{port} ({err.strerror or err}); "
                             f"pick a free port") from None
        self.httpd.daemon_threads = True
        self.host, self.port = host, self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="status-page", daemon=True)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> None:
        self._thread.start()
        log.info("status page at %s (listening on %s:%d)", self.url, self.host, self.port)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5.0)
