"""`/ui/api` answers bad query parameters in the one OpenAI error shape (issue 13, item 10d):
a 400 with `error.{message,type,param,code}`, never FastAPI's own 422 `{"detail": [...]}`."""
from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tracer.record.stages import SERVER_STAGES
from tracer.sinks.store import TraceStore
from tracer.web.ui_api import make_ui_router


@pytest.fixture(scope="module")
def client():
    app = FastAPI()
    app.include_router(make_ui_router(store=TraceStore(10), stages=SERVER_STAGES))
    return TestClient(app)


@pytest.mark.parametrize("path,param", [
    ("/ui/api/requests?limit=abc", "limit"), ("/ui/api/requests?limit=0", "limit"),
    ("/ui/api/requests?limit=10001", "limit"), ("/ui/api/requests?limit=", "limit"),
    ("/ui/api/requests?limit=" + "9" * 5000, "limit"), ("/ui/api/requests?limit=-1", "limit"),
    ("/ui/api/requests?limit=%F0%9F%98%80", "limit"), ("/ui/api/attribution?last=1.5", "last"),
    ("/ui/api/attribution?last=10001", "last"), ("/ui/api/attribution?last=%00", "last"),
])
def test_a_bad_query_parameter_is_a_400_in_the_openai_shape(client, path, param):
    response = client.get(path)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["param"] == param and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/ui/api/requests?limit=1000", "/ui/api/requests",
                                  "/ui/api/attribution?last=1", "/ui/api/attribution"])
def test_good_values_still_answer(client, path):
    assert client.get(path).status_code == 200
