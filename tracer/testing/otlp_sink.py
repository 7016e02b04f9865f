"""An OTLP/HTTP destination on loopback that keeps every body exactly as it arrived: the
witness that the proxy's receiver forwards spans unchanged.

    sink = OtlpSink().start()
    environ = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink.url}
    ...
    assert sink.wait_for(1)
    sink.bodies[0].body, sink.bodies[0].headers["content-encoding"]
"""
from __future__ import annotations

import http.server
import threading
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ReceivedBody:
    headers: dict[str, str]
    body: bytes


class OtlpSink:
    """
    >>> sink = OtlpSink().start(); sink.url.endswith("/v1/traces"); sink.stop()
    True
    """

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.bodies: list[ReceivedBody] = []
        self._changed = threading.Condition()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def start(self) -> OtlpSink:
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(sink.status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()
                with sink._changed:
                    sink.bodies.append(ReceivedBody(
                        {k.lower(): v for k, v in self.headers.items()}, body))
                    sink._changed.notify_all()

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def wait_for(self, num_bodies: int, timeout_s: float = 10.0) -> bool:
        """Block until `num_bodies` have arrived (a bounded wait on a condition)."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.bodies) >= num_bodies, timeout_s)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
