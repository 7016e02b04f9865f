"""dashboards/alert_receiver/receiver.py: what Alertmanager posts is logged and listed; bad
bodies get a 4xx, never a crash. (The live test sends it a real Alertmanager notification.)"""
from __future__ import annotations

import io
import json
import threading

import httpx
import pytest

from dashboards_support import DASHBOARDS, load_module

receiver = load_module(DASHBOARDS / "alert_receiver" / "receiver.py", "ttftscope_alert_receiver")

# The shape of an Alertmanager (webhook version 4) notification.
PAYLOAD = {
    "version": "4", "receiver": "webhook", "status": "firing", "groupKey": "{}:{}",
    "alerts": [{"status": "firing", "labels": {"alertname": "LLMTTFTP95High", "model": "m"},
                "annotations": {"summary": "slow"}, "startsAt": "2025-01-01T00:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z", "fingerprint": "abc", "generatorURL": "x"}],
}


@pytest.fixture()
def running():
    out = io.StringIO()
    server = receiver.serve("127.0.0.1", 0, keep=2, out=out)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}", timeout=10,
                          trust_env=False)
    yield client, out
    client.close()
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_each_alert_is_one_json_line_and_listed_newest_first(running):
    client, out = running
    assert client.post("/alerts", json=PAYLOAD).json() == {"received": 1}
    second = {**PAYLOAD, "alerts": [{**PAYLOAD["alerts"][0], "status": "resolved"}]}
    assert client.post("/alerts", json=second).status_code == 200
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(l["event"], l["alertname"], l["status"]) for l in lines] == [
        ("alert", "LLMTTFTP95High", "firing"), ("alert", "LLMTTFTP95High", "resolved")]
    assert lines[0]["labels"] == {"alertname": "LLMTTFTP95High", "model": "m"}
    assert lines[0]["receiver"] == "webhook" and lines[0]["annotations"] == {"summary": "slow"}
    listed = client.get("/").json()["alerts"]
    assert [a["status"] for a in listed] == ["resolved", "firing"]


def test_keeps_only_the_newest(running):
    client, _ = running
    for name in ("a", "b", "c"):
        alert = {**PAYLOAD["alerts"][0], "labels": {"alertname": name}}
        assert client.post("/alerts", json={**PAYLOAD, "alerts": [alert]}).status_code == 200
    assert [a["alertname"] for a in client.get("/").json()["alerts"]] == ["c", "b"]


@pytest.mark.parametrize("body, status", [
    (b"{not json", 400), (b"[1, 2]", 400), (b'{"alerts": "x"}', 400), (b'{"alerts": [1]}', 400),
    (b"x" * (receiver.MAX_BODY_BYTES + 1), 413),
])
def test_bad_bodies_get_a_4xx_and_log_nothing(running, body, status):
    client, out = running
    response = client.post("/alerts", content=body)
    assert response.status_code == status and "error" in response.json()
    assert out.getvalue() == "" and client.get("/").json() == {"alerts": []}


def test_unknown_paths_are_404_and_ready_is_200(running):
    client, _ = running
    assert client.post("/other", json=PAYLOAD).status_code == 404
    assert client.get("/alerts").status_code == 404
    assert client.get("/-/ready").status_code == 200
