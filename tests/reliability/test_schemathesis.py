"""Issue 13, reliability suite: schemathesis over both fronts' published OpenAPI documents.

Every operation gets a bounded number of generated requests, valid and invalid
(schemathesis' positive and negative modes), against a live server on loopback. Required of
every answer: no 5xx, and every error (4xx) is the OpenAI error shape. The engine generates
real tokens for valid completions, so their token budget is capped (the fuzzing is of the
request surface, not of generation length).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode

from generation_cap import cap_generation
from reliability_support import serve
from tracer.proxy.app import ProxySettings, create_proxy_app
from tracer.testing.fake_upstream import MODEL as FAKE_MODEL, FakeUpstream
from tracer.web.observability import ObservabilitySettings

EXAMPLES_PER_OPERATION = 100   # per generation mode: 200 requests per operation
# Hundreds of beacons from one address would only test the rate limiter.
FUZZ_OBSERVABILITY = ObservabilitySettings(probe_rate_per_s=1e6, probe_burst=1_000_000)


def _violation(response) -> str | None:
    """Why `response` breaks the contract, or None."""
    if response.status_code >= 500:
        return f"{response.status_code}: {response.text[:300]}"
    if response.status_code < 400:
        return None
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} not in the OpenAI error shape: {response.text[:300]}"
    if not (isinstance(error, dict) and isinstance(error.get("message"), str)
            and isinstance(error.get("type"), str) and "param" in error and "code" in error):
        return f"{response.status_code} error object incomplete: {error}"
    return None


def fuzz(base_url: str) -> list[str]:
    """Runs every operation of `base_url`'s /openapi.json; the contract violations found
    (one per operation and mode at most: hypothesis stops at the first)."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    problems: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations, "the document lists no operation"
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                      derandomize=True)
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case) -> None:
                cap_generation(case.body)
                response = case.call(base_url=base_url, timeout=60)
                problem = _violation(response)
                assert problem is None, (f"{case.method} {case.formatted_path} "
                                         f"body={str(case.body)[:200]}: {problem}")
            try:
                run()
            except AssertionError as exc:
                problems.append(f"[{mode.value}] {exc}".splitlines()[0][:600])
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, operation.label
                # no parameter and no body: there is nothing to make invalid
    return problems


def test_the_engine_server_fuzzed_from_its_openapi(server_factory):
    from instrumented_engine.server.app import ServerSettings
    srv = server_factory(ServerSettings(FUZZ_OBSERVABILITY))
    problems = fuzz(srv.base_url)
    srv.wait_idle(60)
    assert problems == []
    assert srv.parts.obs.tracer.sink_failures == {}


@pytest.fixture
def proxy():
    upstream = FakeUpstream(chunks=3, gap_ms=0).start()
    parts = create_proxy_app(ProxySettings(upstream.base_url, observability=FUZZ_OBSERVABILITY),
                             model_names=(FAKE_MODEL,))
    served = serve(parts.app)
    yield served, parts
    served.stop()
    upstream.stop()


def test_the_proxy_fuzzed_from_its_openapi(proxy):
    served, parts = proxy
    problems = fuzz(served.base_url)
    assert problems == []
    assert parts.obs.tracer.sink_failures == {}


# --checks all (issue 22 item 8): every built-in check of the schemathesis CLI, with the
# response conformance ones (status codes, content types, headers, schemas, SSE events),
# data acceptance and rejection, and 405 + `Allow` for methods the document does not list.
HERE = pathlib.Path(__file__).resolve().parent
CLI_EXAMPLES_PER_OPERATION = 30
CLI_TIMEOUT_S = 480


def run_all_checks(base_url: str) -> None:
    """The schemathesis CLI with `--checks all` against `base_url`'s /openapi.json, bounded
    in examples and time; fails with the CLI's report."""
    argv = [str(pathlib.Path(sys.executable).with_name("schemathesis")),
            "--config-file", str(HERE / "schemathesis.toml"), "run",
            base_url + "/openapi.json", "--checks", "all",
            "--phases", "examples,coverage,fuzzing", "--mode", "all",
            "--max-examples", str(CLI_EXAMPLES_PER_OPERATION), "--generation-deterministic",
            "--workers", "1", "--request-timeout", "60", "--no-color"]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(HERE), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env,
                          cwd=HERE)
    assert done.returncode == 0, (done.stdout[-6000:] + done.stderr[-2000:])
    assert " passed" in done.stdout and "failure" not in done.stdout.lower(), done.stdout[-3000:]


def test_the_engine_server_passes_every_schemathesis_check(server_factory):
    from instrumented_engine.server.app import ServerSettings
    srv = server_factory(ServerSettings(FUZZ_OBSERVABILITY))
    run_all_checks(srv.base_url)
    srv.wait_idle(60)
    assert srv.parts.obs.tracer.sink_failures == {}


def test_the_proxy_passes_every_schemathesis_check(proxy):
    served, parts = proxy
    run_all_checks(served.base_url)
    assert parts.obs.tracer.sink_failures == {}
