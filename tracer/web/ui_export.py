"""`GET /ui/api/export?minutes=N` (or `from_unix_ms`/`to_unix_ms`): a window's requests'
export fields, for
`python -m tracer trace export --url` (docs/reference.md, "Trace export (Mooncake JSONL)").

Each row holds what a `request_finished` log line holds for the export (the same function
writes both: `tracer.record.block_chain.export_fields`), so `--url` and `--log` give the same
lines. Bounded: the store's records at most, and at most `MAX_CHAIN_BYTES` of block chains
(~2,000 requests of 128 Ki tokens; 30,000 of 2,000): the rest is counted in `num_more`.
No prompt text: the record holds none.
"""
from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from tracer.record.block_chain import DEFAULT_EXPORT_MINUTES, MAX_EXPORT_MINUTES, export_fields
from tracer.record.request_record import RequestRecord
from tracer.web.openai_http import OpenAIError, bounded_int
from tracer.web.ui_range import RANGE_PARAMETERS, time_range

MAX_CHAIN_BYTES = 32 << 20
# The most requests one export reads from the store (past the chain bound it only counts).
MAX_EXPORT_REQUESTS = 100_000


def export_row(record: RequestRecord) -> dict:
    return {"trace_id": record.trace_id, "prompt_tokens": record.num_prompt_tokens,
            "output_tokens": record.num_output_tokens, **export_fields(record)}


def export_rows(records: list[RequestRecord]) -> dict:
    """The rows of `records` (newest first, as the store lists them) that went through the
    tracer's worker, oldest first, within the bound."""
    rows, size, num_more = [], 0, 0
    for record in records:
        if record.arrival_unix_ms is None:
            continue
        size += len(record.block_chain)
        if size > MAX_CHAIN_BYTES:
            num_more += 1
            continue
        rows.append(export_row(record))
    rows.reverse()
    return {"requests": rows, "num_more_requests": num_more}


def add_export_route(router: APIRouter, *, store, drain: Callable[[], object], prefix: str,
                     responses: dict, no_store: dict) -> None:
    @router.get(f"{prefix}/api/export", responses=responses, openapi_extra={"parameters": [{
        "name": "minutes", "in": "query", "required": False, "schema": {
            "type": "integer", "minimum": 1, "maximum": MAX_EXPORT_MINUTES,
            "default": DEFAULT_EXPORT_MINUTES}}, *RANGE_PARAMETERS]})
    async def export(minutes: str = Query(str(DEFAULT_EXPORT_MINUTES),
                                          include_in_schema=False),
                     from_unix_ms: str = Query("", include_in_schema=False),
                     to_unix_ms: str = Query("", include_in_schema=False)):
        try:
            n_minutes = bounded_int(minutes, "minutes", 1, MAX_EXPORT_MINUTES)
            lo, hi = time_range(from_unix_ms, to_unix_ms, minutes=minutes,
                                max_minutes=MAX_EXPORT_MINUTES)
        except OpenAIError as exc:
            return exc.response()
        drain()     # the worker sets the fields after the store has the record
        records = await run_in_threadpool(store.window, lo, hi, limit=MAX_EXPORT_REQUESTS)
        body = export_rows(records)
        body["minutes"] = n_minutes
        return JSONResponse(body, headers=no_store)
