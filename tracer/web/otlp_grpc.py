"""OTLP/gRPC trace receiver: `opentelemetry.proto.collector.trace.v1.TraceService/Export`,
served by grpcio (HTTP/2 is grpcio's, never ours), for the engines whose exporters speak
only or by default gRPC (TGI; vLLM and SGLang unless told `http/protobuf`).

A call that sends nothing must hold nothing anyone else needs (issue 39, break 6: four
silent calls held all of a thread-pool server's workers, which wait in the handler for the
request message). So the server is grpcio's asyncio one, on a loop of its own in one thread:
a call waiting for its message is a suspended coroutine, not a worker.

- The bearer token is checked by a server interceptor, from the call's metadata, before
  the handler runs: a wrong or missing one is `UNAUTHENTICATED` (counted `unauthorized`)
  without a message being read.
- `Export` is registered as client-streaming with no deserializer, so the handler reads
  the one request message itself, as bytes, within `read_timeout_s` of its start; a call
  that has not sent it by then is `DEADLINE_EXCEEDED` (counted `read_timeout`), and one
  that half-closes without a message is `UNIMPLEMENTED` (not counted), as grpcio's own
  unary handling answers a unary method without its message. Clients see a unary method:
  the wire is the same.
- `max_concurrent_rpcs`: more are refused with `RESOURCE_EXHAUSTED` at once;
  `max_message_bytes`: grpcio's receive limit, on the decompressed message
  (`RESOURCE_EXHAUSTED`).
- Parsing and reading the spans run on `max_workers` threads; the tee and the join's
  match run on the proxy's event loop, handed over with `call_soon_threadsafe`. The bytes
  go to the tee unchanged (protobuf to protobuf).
"""
from __future__ import annotations

import asyncio
import hmac
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tracer.engines.spans import MalformedOTLP, count_spans, request_from_protobuf
from tracer.web.otlp_receiver import PROTOBUF, OtlpReceiver

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_OK = ExportTraceServiceResponse()
# An exporter sends its whole message at once (OTLP exporters time out after 10 s by
# default); 16 MiB at 20 Mbit/s is under 7 s.
DEFAULT_READ_TIMEOUT_S = 10.0


class _Refused(Exception):
    def __init__(self, outcome: str | None, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.outcome, self.code, self.details = outcome, code, details


class _TokenGate(grpc.aio.ServerInterceptor):
    """Checks `authorization` before any handler runs; the refusal reads no message."""

    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver
        self._refuse = grpc.stream_unary_rpc_method_handler(self._unauthenticated)

    async def intercept_service(self, continuation, handler_call_details):
        expected = self.receiver.expected
        if expected is not None:
            given = next((value for key, value in handler_call_details.invocation_metadata or ()
                          if key == "authorization"), "")
            if isinstance(given, str):
                given = given.encode("latin-1", "replace")
            if not hmac.compare_digest(given, expected):
                self.receiver.count("grpc", "unauthorized")
                return self._refuse
        return await continuation(handler_call_details)

    @staticmethod
    async def _unauthenticated(_requests, context) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


class OtlpGrpcReceiver:
    """A gRPC server beside the proxy's HTTP one, sharing the HTTP receiver's counters, tee,
    token and span limit.

    >>> from prometheus_client import CollectorRegistry
    >>> http = OtlpReceiver(CollectorRegistry(), on_timings=None)
    >>> OtlpGrpcReceiver(http, "127.0.0.1:0").max_concurrent_rpcs
    64
    """

    def __init__(self, receiver: OtlpReceiver, listen: str, *, max_workers: int = 4,
                 max_concurrent_rpcs: int = 64, max_message_bytes: int | None = None,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> None:
        if not read_timeout_s > 0:
            raise ValueError("the OTLP/gRPC read timeout must be > 0 s")
        self.receiver = receiver
        self.listen = listen
        self.max_workers = max_workers
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.max_message_bytes = max_message_bytes or receiver.max_decoded_bytes
        self.read_timeout_s = read_timeout_s
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None        # the proxy's
        self._grpc_loop: asyncio.AbstractEventLoop | None = None   # the server's own
        self._server: grpc.aio.Server | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> int:
        """Serve on `listen` (port 0: any free one) from a thread of its own; returns the
        port once it listens. `loop` (the proxy's) gets the tee and the join's match."""
        self._loop = loop
        self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="otlp-grpc")
        started: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True,
                                        name="otlp-grpc-server")
        self._thread.start()
        self.port = started.result(timeout=30)   # raises what the start raised
        return self.port

    def _run(self, started: Future) -> None:
        # A plain selector loop, whatever policy the process set (uvicorn's uvloop).
        loop = self._grpc_loop = asyncio.SelectorEventLoop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:   # noqa: BLE001 - handed to start()
            if not started.done():
                started.set_exception(exc)
            loop.close()
            return
        started.set_result(self.port)
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _serve(self) -> None:
        server = grpc.aio.server(
            interceptors=[_TokenGate(self.receiver)],
            maximum_concurrent_rpcs=self.max_concurrent_rpcs,
            options=[("grpc.max_receive_message_length", self.max_message_bytes),
                     ("grpc.so_reuseport", 0)])
        handler = grpc.stream_unary_rpc_method_handler(
            self._export, request_deserializer=None,
            response_serializer=ExportTraceServiceResponse.SerializeToString)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        port = server.add_insecure_port(self.listen)
        if not port:
            raise OSError(f"OTLP/gRPC: cannot listen on {self.listen}")
        await server.start()
        self.port, self._server = port, server

    def stop(self, grace_s: float = 1.0) -> None:
        loop, server = self._grpc_loop, self._server
        if loop is None or server is None:
            return
        self._server = None
        try:
            asyncio.run_coroutine_threadsafe(server.stop(grace_s), loop).result(grace_s + 5)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(grace_s + 5)
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _export(self, _requests, context) -> ExportTraceServiceResponse:
        r = self.receiver
        try:
            data = await self._read_one(context)
            num_spans, found = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._read_spans, data)
        except _Refused as refused:
            if refused.outcome is not None:
                r.count("grpc", refused.outcome)
            await context.abort(refused.code, refused.details)
        try:
            self._loop.call_soon_threadsafe(self._deliver, data, num_spans, found)
        except RuntimeError:   # the proxy's loop has closed: shutting down
            await context.abort(grpc.StatusCode.UNAVAILABLE, "shutting down")
        return _OK

    async def _read_one(self, context) -> bytes:
        try:
            data = await asyncio.wait_for(context.read(), self.read_timeout_s)
        except asyncio.TimeoutError:
            raise _Refused("read_timeout", grpc.StatusCode.DEADLINE_EXCEEDED,
                           f"no request message within {self.read_timeout_s:g} s") from None
        if data is grpc.aio.EOF:
            # No message: the client ended its stream, or grpcio refused the message as too
            # large (it has answered RESOURCE_EXHAUSTED itself; the handler cannot tell the
            # two apart). Neither is an export, and neither is counted, as before.
            raise _Refused(None, grpc.StatusCode.UNIMPLEMENTED,
                           f'"/{SERVICE}/Export" requires exactly one request message.')
        return data

    def _read_spans(self, data: bytes) -> tuple[int, list]:
        # On a pool thread: the message is parsed, counted and its engine spans read.
        r = self.receiver
        try:
            request = request_from_protobuf(data)
        except MalformedOTLP as exc:   # malformed, too_many_{spans,attributes}
            raise _Refused(exc.outcome, grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        num_spans = count_spans(request)
        if num_spans > r.max_spans:
            raise _Refused("too_many_spans", grpc.StatusCode.INVALID_ARGUMENT,
                           f"{num_spans} spans in one export; at most {r.max_spans}")
        return num_spans, r.read_export(request) if r.on_timings is not None else []

    def _deliver(self, data: bytes, num_spans: int, found: list) -> None:
        self.receiver.accepted("grpc", data, PROTOBUF, None, num_spans)
        self.receiver.deliver(found)
