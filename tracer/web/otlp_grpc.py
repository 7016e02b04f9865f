"""OTLP/gRPC trace receiver: `opentelemetry.proto.collector.trace.v1.TraceService/Export`,
served by grpcio (HTTP/2 is grpcio's, never ours), for the engines whose exporters speak
only or by default gRPC (TGI; vLLM and SGLang unless told `http/protobuf`).

The method is registered with no request deserializer, so the handler gets the message's
bytes as they arrived: they are parsed here (malformed → `INVALID_ARGUMENT`, counted), and
the same bytes go to the tee, whose destination speaks OTLP/HTTP protobuf: protobuf to
protobuf, unchanged. Bounds: `max_message_bytes` (grpcio's receive limit, checked on the
decompressed message: `RESOURCE_EXHAUSTED`), spans per export (`INVALID_ARGUMENT`),
`max_concurrent_rpcs` (more are refused with `RESOURCE_EXHAUSTED` at once, so a slow client
holds one slot, not the server) and `max_workers` threads. A configured bearer token is
checked against the `authorization` metadata (`UNAUTHENTICATED`).

The handler (parsing, and reading the engine spans) runs on grpcio's threads; the tee and
the join's match run on the proxy's event loop, handed over with `call_soon_threadsafe`.
"""
from __future__ import annotations

import asyncio
import hmac
from concurrent.futures import ThreadPoolExecutor

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tracer.engines.detect import engine_timings
from tracer.engines.spans import MalformedOTLP, count_spans, request_from_protobuf, spans_of
from tracer.web.otlp_receiver import PROTOBUF, OtlpReceiver

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_OK = ExportTraceServiceResponse()


class OtlpGrpcReceiver:
    """A gRPC server beside the proxy's HTTP one, sharing the HTTP receiver's counters, tee,
    token and span limit.

    >>> from prometheus_client import CollectorRegistry
    >>> http = OtlpReceiver(CollectorRegistry(), on_timings=None)
    >>> OtlpGrpcReceiver(http, "127.0.0.1:0").max_concurrent_rpcs
    64
    """

    def __init__(self, receiver: OtlpReceiver, listen: str, *, max_workers: int = 4,
                 max_concurrent_rpcs: int = 64, max_message_bytes: int | None = None) -> None:
        self.receiver = receiver
        self.listen = listen
        self.max_workers = max_workers
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.max_message_bytes = max_message_bytes or receiver.max_decoded_bytes
        self.port: int | None = None
        self._server: grpc.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> int:
        """Serve on `listen` (port 0: any free one); returns the port."""
        self._loop = loop
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="otlp-grpc"),
            maximum_concurrent_rpcs=self.max_concurrent_rpcs,
            options=[("grpc.max_receive_message_length", self.max_message_bytes),
                     ("grpc.so_reuseport", 0)])
        handler = grpc.unary_unary_rpc_method_handler(
            self._export, request_deserializer=None,
            response_serializer=ExportTraceServiceResponse.SerializeToString)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        self.port = server.add_insecure_port(self.listen)
        if not self.port:
            raise OSError(f"OTLP/gRPC: cannot listen on {self.listen}")
        server.start()
        self._server = server
        return self.port

    def stop(self, grace_s: float = 1.0) -> None:
        if self._server is not None:
            self._server.stop(grace_s).wait(grace_s + 1)
            self._server = None

    def _export(self, data: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        r = self.receiver
        if r.expected is not None:
            given = dict(context.invocation_metadata()).get("authorization", "")
            if not hmac.compare_digest(given.encode("latin-1", "replace"), r.expected):
                r.count("grpc", "unauthorized")
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            request = request_from_protobuf(data)
        except MalformedOTLP as exc:
            r.count("grpc", exc.outcome)   # malformed, too_many_{spans,attributes}
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        num_spans = count_spans(request)
        if num_spans > r.max_spans:
            r.count("grpc", "too_many_spans")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{num_spans} spans in one export; at most {r.max_spans}")
        # The spans are read here, on grpcio's thread; the loop gets the tee and the match.
        found = engine_timings(spans_of(request)) if r.on_timings is not None else []
        try:
            self._loop.call_soon_threadsafe(self._deliver, data, num_spans, found)
        except RuntimeError:   # the proxy's loop has closed: shutting down
            context.abort(grpc.StatusCode.UNAVAILABLE, "shutting down")
        return _OK

    def _deliver(self, data: bytes, num_spans: int, found: list) -> None:
        self.receiver.accepted("grpc", data, PROTOBUF, None, num_spans)
        self.receiver.deliver(found)
