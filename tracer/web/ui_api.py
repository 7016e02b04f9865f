"""The waterfall UI's JSON API and its static files, as FastAPI routers.

What a route answers is built elsewhere: a record's row and waterfall in
tracer/web/ui_waterfall.py, the stages' shares in tracer/web/ui_attribution.py, a timeline
window in tracer/web/ui_timeline.py, the export in tracer/web/ui_export.py.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from fastapi import APIRouter, Path as PathParam, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from tracer.record.chrome_trace import chrome_trace
from tracer.record.clock import Clock
from tracer.record.diagnosis_window import DEFAULT_TTFT_SLO_S, VerdictRow, rank_causes
from tracer.record.request_record import RequestRecord
from tracer.record.stages import SERVER_STAGES
from tracer.record.traceparent import is_trace_id
from tracer.record.window_limits import DEFAULT_PAD_MS
from tracer.web.gzip_static import file_response
from tracer.web.openai_http import ERROR_SCHEMA, OpenAIError, bounded_int
from tracer.web.probe.endpoint import TRACE_ID_PATTERN
from tracer.web.ui_attribution import attribution_of
from tracer.web.ui_export import add_export_route
from tracer.web.ui_range import RANGE_PARAMETERS, time_range
from tracer.web.ui_timeline import (
    TIMELINE_QUERY,
    neighbours_view,
    timeline_of,
    window_of_query,
)
from tracer.web.ui_waterfall import _ms, summary_of, waterfall_of

UI_DIR = Path(__file__).resolve().parent / "static" / "ui"
_NO_STORE = {"Cache-Control": "no-store"}
_ERROR_CONTENT = {"application/json": {"schema": ERROR_SCHEMA}}
# What /openapi.json lists besides the 200 (tracer/web/openapi_common.py drops FastAPI's 422:
# the parameters are read as strings here, and a bad one is the 400).
_BAD_VALUE = {400: {"description": "A parameter out of range", "content": _ERROR_CONTENT}}
# The API key gate's refusal of a trace id holding a dot segment or an encoded separator.
_BAD_PATH = {400: {"description": "A request path that is not normalised",
                   "content": _ERROR_CONTENT}}
_NOT_FOUND = {404: {"description": "No such trace in the store", "content": _ERROR_CONTENT}}


def _int_query(name: str, default: int, high: int) -> dict:
    """The document's view of a query parameter the route reads as a string and checks
    itself (`bounded_int`): an integer from 1 to `high`."""
    return {"parameters": [{"name": name, "in": "query", "required": False, "schema": {
        "type": "integer", "minimum": 1, "maximum": high, "default": default}}]}


# The longest window /ui/api/diagnosis ranks, and the largest TTFT objective it takes: ten
# minutes (six digits, as `bounded_int` reads).
MAX_WINDOW_MINUTES = 7 * 24 * 60
MAX_SLO_MS = 600_000
# The most requests one diagnosis ranks: the newest of a longer window (the answer says how
# many it considered); a store read past this would hold a thread for seconds.
MAX_DIAGNOSIS_REQUESTS = 20_000
ORDERS = ("recent", "slowest")
MAX_REQUESTS_LIMIT = 10_000
MAX_MODEL_CHARS = 256

_MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".mjs": "text/javascript; charset=utf-8"}


def make_ui_router(*, store, clock: Clock | None = None, prefix: str = "/ui",
                   static_dir: Path = UI_DIR, stages: tuple[str, ...] = SERVER_STAGES,
                   drain: Callable[[], object] | None = None,
                   neighbourhood=None) -> APIRouter:
    """`{prefix}/` (the page), its assets, and
    `{prefix}/api/{requests,trace,attribution,diagnosis,timeline,export}` (the last in
    tracer/web/ui_export.py); `stages` are the server's own (the engine's nine, or the
    proxy's five). `drain` (the tracer's) runs before a read
    that shows verdicts, which the tracer's worker sets after the store has the record.
    `neighbourhood` (tracer/core/neighbourhood.py) answers the timeline and each trace's
    neighbours; without it the trace has none and the timeline is not served.

    >>> from fastapi import FastAPI
    >>> from tracer.sinks.store import TraceStore
    >>> app = FastAPI(); app.include_router(make_ui_router(store=TraceStore()))
    """
    clock = Clock() if clock is None else clock
    drain = (lambda: None) if drain is None else drain
    router = static_files_router({
        f"{prefix}/": static_dir / "index.html", f"{prefix}/ui.css": static_dir / "ui.css",
        # the page's scripts, as index.html loads them
        **{f"{prefix}/{name}": static_dir / name for name in (
            "dom.js", "api.js", "palette.js", "requests_table.js", "attribution.js",
            "waterfall.js", "facts.js", "verdict.js", "ui.js", "timeline.js")}})

    @router.get(prefix, include_in_schema=False)
    async def ui_root():
        return RedirectResponse(f"{prefix}/", status_code=307)

    @router.get(f"{prefix}/api/requests", responses=_BAD_VALUE, openapi_extra={
        "parameters": _int_query("limit", 50, MAX_REQUESTS_LIMIT)["parameters"]
        + RANGE_PARAMETERS + [
            {"name": "stages", "in": "query", "required": False,
             "description": "1: each row also has its stages' durations and TPOT",
             "schema": {"type": "integer", "enum": [0, 1], "default": 0}},
            {"name": "order", "in": "query", "required": False,
             "schema": {"type": "string", "enum": list(ORDERS), "default": "recent"}},
            {"name": "model", "in": "query", "required": False,
             "schema": {"type": "string", "maxLength": MAX_MODEL_CHARS}}]})
    async def recent_requests(limit: str = Query("50", include_in_schema=False),
                              from_unix_ms: str = Query("", include_in_schema=False),
                              to_unix_ms: str = Query("", include_in_schema=False),
                              order: str = Query("recent", include_in_schema=False),
                              model: str = Query("", include_in_schema=False),
                              stages: str = Query("0", include_in_schema=False)):
        try:
            n = bounded_int(limit, "limit", 1, MAX_REQUESTS_LIMIT)
            if stages not in ("0", "1"):
                raise OpenAIError(400, "stages must be 0 or 1", param="stages",
                                  code="invalid_value")
            lo, hi = time_range(from_unix_ms, to_unix_ms)
            if order not in ORDERS:
                raise OpenAIError(400, f"order must be one of {', '.join(ORDERS)}",
                                  param="order", code="invalid_value")
            if len(model) > MAX_MODEL_CHARS:
                raise OpenAIError(400, f"model is at most {MAX_MODEL_CHARS} characters",
                                  param="model", code="invalid_value")
        except OpenAIError as exc:
            return exc.response()
        drain()     # the rows carry the verdicts' causes
        # A database read: off the event loop, which serves the requests themselves.
        records = await run_in_threadpool(store.window, lo, hi, limit=n, order=order,
                                          model=model or None)
        rows = [summary_of(r, clock) for r in records]
        if stages == "1":
            for row, record in zip(rows, records):
                row["tpot_ms"] = _ms(record.tpot_ns)
                row["stages_ms"] = {s.stage: s.duration_ns / 1e6 for s in record.stages}
        return JSONResponse({"requests": rows, "order": order}, headers=_NO_STORE)

    @router.get(f"{prefix}/api/trace/{{trace_id}}", responses={**_BAD_PATH, **_NOT_FOUND})
    async def trace(trace_id: str = PathParam(json_schema_extra={"pattern": TRACE_ID_PATTERN})):
        record = await run_in_threadpool(store.get, trace_id) if is_trace_id(trace_id) else None
        if record is not None and record.verdict is None and record.ttft_ns is not None:
            drain()     # judged on the tracer's worker, after the store had it
        if record is None:
            return OpenAIError(404, "no request with this trace id in the store "
                               "(unknown, or deleted by retention)",
                               param="trace_id", code="trace_not_found").response()
        view = waterfall_of(record, clock)
        if neighbourhood is not None:
            view["neighbours"] = await run_in_threadpool(neighbours_view, neighbourhood, record)
        return JSONResponse(view, headers=_NO_STORE)

    def window_route(render: Callable[[dict], dict], headers: dict):
        """A route answering a timeline window (docs/reference.md, "Timeline and
        neighbours"), rendered by `render`."""
        async def route(trace_id: str = Query("", include_in_schema=False),
                        pad_ms: str = Query(str(DEFAULT_PAD_MS), include_in_schema=False),
                        from_unix_ms: str = Query("", include_in_schema=False),
                        to_unix_ms: str = Query("", include_in_schema=False)):
            try:   # both read the store: off the event loop
                window = await run_in_threadpool(window_of_query, store, clock, neighbourhood,
                                                 trace_id, pad_ms, from_unix_ms, to_unix_ms)
            except OpenAIError as exc:
                return exc.response()
            drain()     # the rows carry the verdicts' causes
            body = await run_in_threadpool(timeline_of, neighbourhood, clock, *window)
            return JSONResponse(render(body), headers=headers)
        return route

    # The window as JSON for /ui, and as Chrome Trace Event JSON, a file Perfetto opens.
    for name, render, headers in (
            ("timeline", lambda body: body, _NO_STORE),
            ("perfetto", chrome_trace, {**_NO_STORE, "Content-Disposition":
                                        'attachment; filename="ttftscope-trace.json"'})):
        router.add_api_route(f"{prefix}/api/{name}", window_route(render, headers),
                             methods=["GET"], name=name,
                             responses={**_BAD_VALUE, **_NOT_FOUND},
                             openapi_extra=TIMELINE_QUERY)

    @router.get(f"{prefix}/api/attribution", responses=_BAD_VALUE,
                openapi_extra=_int_query("last", 100, 10_000))
    async def attribution(last: str = Query("100", include_in_schema=False)):
        try:
            n = bounded_int(last, "last", 1, 10_000)
        except OpenAIError as exc:
            return exc.response()
        return JSONResponse(attribution_of(store.recent(n), stages), headers=_NO_STORE)

    @router.get(f"{prefix}/api/diagnosis", responses=_BAD_VALUE, openapi_extra={
        "parameters": _int_query("minutes", 15, MAX_WINDOW_MINUTES)["parameters"]
        + _int_query("slo_ms", int(DEFAULT_TTFT_SLO_S * 1e3), MAX_SLO_MS)["parameters"]
        + RANGE_PARAMETERS})
    async def diagnosis(minutes: str = Query("15", include_in_schema=False),
                        slo_ms: str = Query(str(int(DEFAULT_TTFT_SLO_S * 1e3)),
                                            include_in_schema=False),
                        from_unix_ms: str = Query("", include_in_schema=False),
                        to_unix_ms: str = Query("", include_in_schema=False)):
        try:
            n_minutes = bounded_int(minutes, "minutes", 1, MAX_WINDOW_MINUTES)
            slo = bounded_int(slo_ms, "slo_ms", 1, MAX_SLO_MS)
            lo, hi = time_range(from_unix_ms, to_unix_ms, minutes=minutes,
                                max_minutes=MAX_WINDOW_MINUTES)
        except OpenAIError as exc:
            return exc.response()
        drain()
        records = await run_in_threadpool(store.window, lo, hi, limit=MAX_DIAGNOSIS_REQUESTS)
        rows = [row for r in records if (row := verdict_row(r))]
        body = rank_causes(rows, slo_ms=float(slo))
        body["minutes"] = n_minutes
        body["from_unix_ms"] = None if lo is None else lo // 1_000_000
        body["to_unix_ms"] = None if hi is None else hi // 1_000_000
        body["truncated"] = len(records) >= MAX_DIAGNOSIS_REQUESTS
        return JSONResponse(body, headers=_NO_STORE)

    add_export_route(router, store=store, drain=drain, prefix=prefix, responses=_BAD_VALUE,
                     no_store=_NO_STORE)
    return router


def verdict_row(record: RequestRecord) -> VerdictRow | None:
    """The record's verdict as a row of the window's ranking; None before it was judged or
    without a first token."""
    verdict = record.verdict
    if verdict is None or record.ttft_ns is None:
        return None
    return VerdictRow(record.trace_id, record.model, verdict.cause, record.ttft_ns / 1e6,
                      verdict.excess_ms, verdict.engine)


def static_files_router(files: Mapping[str, Path]) -> APIRouter:
    """GET routes for a fixed set of files (no directory listing, no path from the URL), each
    re-read from disk per request so editing a page needs no restart."""
    router = APIRouter()
    for url_path, file_path in files.items():
        router.add_api_route(url_path, _file_endpoint(Path(file_path)), methods=["GET"],
                             include_in_schema=False)
    return router


def _file_endpoint(path: Path):
    async def serve_file(request: Request):
        if not path.is_file():
            return OpenAIError(404, f"{path.name} is not installed",
                               code="not_found").response()
        return file_response(path, _MEDIA_TYPES.get(path.suffix),
                             request.headers.get("accept-encoding"), {"Cache-Control": "no-cache"})
    return serve_file
