"""Faults between segack and a real Schema Registry: a loopback front (HTTP, or HTTPS with a
certificate the test makes) that passes each request on to the registry behind it, unless a fault
is queued for it. It answers nothing of its own but the faults: the registry is Karapace
(``tests/schema_registry.py``), never one written here.

A fault is what the network or a misconfigured proxy gives a client: an HTTP status with headers
(a 429, a redirect), a body that is not the registry's (a login page, JSON without a schema), an
answer cut off after its headers. Every request is recorded with its headers, so a test can say
what reached where.
"""

from __future__ import annotations

import contextlib
import http.server
import ssl
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_ports


@dataclass(frozen=True)
class Fault:
    """One answer in place of the registry's: ``status`` with ``headers`` and ``body``; with ``cut``,
    headers that promise more body than is sent before the connection closes."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    cut: bool = False
    #: Only a request whose method and path (``"GET /schemas/ids/1"``) hold this is answered with
    #: the fault (any, when empty).
    path_holds: str = ""


class FaultyFront:
    """The front; :attr:`url` is its address, :meth:`inject` queues faults for the next requests."""

    def __init__(self, upstream: str, certificate: tuple[Path, Path] | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults: deque[Fault] = deque()
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()
        (port,) = free_ports(1)
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        scheme = "http"
        if certificate is not None:
            key, chain = certificate
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(chain), str(key))
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def inject(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def paths(self, method: str = "GET") -> list[str]:
        """The paths of the requests of ``method``, in order."""
        with self._lock:
            return [path.partition(" ")[2] for path, _ in self.requests if path.startswith(f"{method} ")]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next_fault(self, path: str, headers: dict[str, str]) -> Fault | None:
        with self._lock:
            self.requests.append((path, headers))
            if self.faults and self.faults[0].path_holds in path:
                return self.faults.popleft()
        return None

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:  # the test's output is for its assertions
                pass

            def do_GET(self) -> None:
                self._pass_on(None)

            def do_POST(self) -> None:
                self._pass_on(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def _pass_on(self, body: bytes | None) -> None:
                fault = front._next_fault(f"{self.command} {self.path}", dict(self.headers))
                if fault is not None:
                    self._answer(fault)
                    return
                headers = {"Accept": self.headers.get("Accept", "*/*")}
                if body is not None:
                    headers["Content-Type"] = self.headers.get("Content-Type", "application/json")
                request = urllib.request.Request(front.upstream + self.path, data=body, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        status, body, kind = answer.status, answer.read(), answer.headers.get("Content-Type")
                except urllib.error.HTTPError as error:
                    status, body, kind = error.code, error.read(), error.headers.get("Content-Type")
                self._answer(Fault(status, body, {"Content-Type": kind or "application/json"}))

            def _answer(self, fault: Fault) -> None:
                self.send_response(fault.status)
                for name, value in fault.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(fault.body) + (100 if fault.cut else 0)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(fault.body)
                self.wfile.flush()
                if fault.cut:
                    self.close_connection = True

        return Handler


@contextlib.contextmanager
def faulty_front(upstream: str, certificate: tuple[Path, Path] | None = None) -> Iterator[FaultyFront]:
    """A :class:`FaultyFront` of the registry at ``upstream`` until the block ends."""
    front = FaultyFront(upstream, certificate)
    try:
        yield front
    finally:
        front.close()
