"""The webhook Alertmanager posts to in docker-compose.yml: it logs and shows the alerts.

Each alert of each POST to /alerts becomes one JSON line on stdout (so `docker compose logs
alert-receiver` and Loki, through Alloy, have it), and GET / lists the newest ones as JSON.
Standard library only: it runs on the plain Python image, with nothing to install.

    python dashboards/alert_receiver/receiver.py --host 0.0.0.0 --port 9095

The body is Alertmanager's webhook payload (version 4): `{"receiver", "status", "alerts":
[{"status", "labels", "annotations", "startsAt", "endsAt", "fingerprint", ...}], ...}`.
"""
from __future__ import annotations

import argparse
import collections
import json
import signal
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TextIO

MAX_BODY_BYTES = 1 << 20       # Alertmanager caps a group at its alerts; 1 MiB is ample
ALERTS_PATH = "/alerts"        # where Alertmanager posts (dashboards/thresholds.py webhook_url)
READY_PATH = "/-/ready"        # compose healthcheck and the live test
ALERT_FIELDS = ("status", "labels", "annotations", "startsAt", "endsAt", "fingerprint")


class AlertLog:
    """The newest `keep` alerts, each also written as one JSON line to `out`.

    >>> import io
    >>> out = io.StringIO()
    >>> log = AlertLog(keep=2, out=out)
    >>> log.add({"receiver": "webhook", "alerts": [{"status": "firing",
    ...          "labels": {"alertname": "A"}}]})
    1
    >>> json.loads(out.getvalue())["alertname"], log.newest()[0]["receiver"]
    ('A', 'webhook')
    """

    def __init__(self, keep: int, out: TextIO) -> None:
        self._alerts: collections.deque[dict] = collections.deque(maxlen=keep)
        self._out, self._lock = out, threading.Lock()

    def add(self, payload: dict) -> int:
        alerts = payload.get("alerts")
        if not isinstance(alerts, list) or not all(isinstance(a, dict) for a in alerts):
            raise ValueError("the body has no `alerts` list of objects")
        entries = [{"event": "alert", "receiver": payload.get("receiver"),
                    "alertname": (a.get("labels") or {}).get("alertname"),
                    **{k: a.get(k) for k in ALERT_FIELDS}} for a in alerts]
        with self._lock:    # whole lines, in arrival order, from concurrent handler threads
            for entry in entries:
                self._out.write(json.dumps(entry, sort_keys=True) + "\n")
                self._alerts.append(entry)
            self._out.flush()
        return len(entries)

    def newest(self) -> list[dict]:
        with self._lock:
            return list(reversed(self._alerts))


def make_handler(log: AlertLog) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if self.path == "/":
                self._reply(HTTPStatus.OK, {"alerts": log.newest()})
            elif self.path == READY_PATH:
                self._reply(HTTPStatus.OK, {"status": "ready"})
            else:
                self._reply(HTTPStatus.NOT_FOUND, {"error": "GET / or /-/ready"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != ALERTS_PATH:
                return self._reply(HTTPStatus.NOT_FOUND, {"error": f"POST {ALERTS_PATH}"})
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                return self._reply(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length"})
            if int(length) > MAX_BODY_BYTES:
                return self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                   {"error": f"body over {MAX_BODY_BYTES} bytes"})
            try:
                count = log.add(json.loads(self.rfile.read(int(length))))
            except (ValueError, AttributeError) as exc:   # bad JSON, not an object, no alerts
                return self._reply(HTTPStatus.BAD_REQUEST, {"error": str(exc)[:200]})
            self._reply(HTTPStatus.OK, {"received": count})

        def _reply(self, status: HTTPStatus, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status >= 400:
                self.send_header("Connection", "close")   # the unread body may still be there
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_args) -> None:
            pass    # stdout carries the alerts only; an access log would interleave with them

    return Handler


def serve(host: str, port: int, keep: int, out: TextIO) -> ThreadingHTTPServer:
    """A server bound to (host, port), not yet serving: call serve_forever()."""
    return ThreadingHTTPServer((host, port), make_handler(AlertLog(keep, out)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9095)
    p.add_argument("--keep", type=int, default=200, help="alerts GET / lists, newest first")
    args = p.parse_args(argv)
    server = serve(args.host, args.port, args.keep, sys.stdout)
    # As PID 1 in a container, Python gets no default SIGTERM action: without this,
    # `docker compose stop` waits its 10 s and kills.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
