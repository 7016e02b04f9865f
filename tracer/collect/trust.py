"""Which received spans of a trace may shape its waterfall (docs/receiver-threat-model.md,
"Spans at the collector").

The collector joins spans from several exporters (a backend, an engine, anything else
holding the receiver's token) by trace id. A trace id is not secret enough to trust
everything that names it: the browser chose it, and the probe's span id and the backend's
span id travel in headers the page reads. So a span shapes the waterfall only through an
edge a real service would create:

- a span sent again (an exporter's retry: same id, name, times and service) counts once, a
  `duplicate`; two different spans claiming one id are both dropped (`duplicate` too): the
  real one cannot be told from the forgery, so neither shapes the trace (an attacker who
  can export can deny a trace its waterfall, never write into it);
- a child and its parent come from the same `service.name`, or the parent is a CLIENT or
  PRODUCER span: the one cross-service edge context propagation makes, whose parent id only
  the callee ever saw. The child's own kind proves nothing more (the parent id is what only
  the callee knows), and callees do not all say SERVER: SGLang's request span is INTERNAL.
  Any other cross-service edge is `forged_parent`: the span and everything under it stay
  out.

A span under a parent that never arrived is kept (its parent may be late, or sampled out);
it only matters if its parents lead to the trace's root.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tracer.engines.spans import SpanView

SERVER, CLIENT, PRODUCER, CONSUMER = 2, 3, 4, 5
_CALLERS = (CLIENT, PRODUCER)


@dataclass(slots=True)
class TrustedTree:
    """A trace's spans by id and children, forged edges cut."""

    by_id: dict[str, SpanView] = field(default_factory=dict)
    children: dict[str, list[SpanView]] = field(default_factory=dict)
    duplicates: int = 0
    forged: int = 0


def edge_allowed(child: SpanView, parent: SpanView) -> bool:
    """
    >>> s = lambda kind, svc: SpanView("a" * 32, "b" * 16, "", "x", 0, {}, 0, kind, svc)
    >>> edge_allowed(s(1, "api"), s(2, "api")), edge_allowed(s(2, "engine"), s(3, "api"))
    (True, True)
    >>> edge_allowed(s(1, "sglang"), s(3, "api"))     # SGLang's INTERNAL request span
    True
    >>> edge_allowed(s(1, "evil"), s(2, "api")), edge_allowed(s(2, "evil"), s(2, "api"))
    (False, False)
    """
    return child.service == parent.service or parent.kind in _CALLERS


def trusted_tree(spans: Iterable[SpanView]) -> TrustedTree:
    tree = TrustedTree()
    conflicted: set[str] = set()
    for span in spans:
        seen = tree.by_id.get(span.span_id)
        if seen is None and span.span_id not in conflicted:
            tree.by_id[span.span_id] = span
            continue
        tree.duplicates += 1
        if seen is not None and _identity(seen) != _identity(span):
            conflicted.add(span.span_id)
            del tree.by_id[span.span_id]
    for span in list(tree.by_id.values()):
        parent = tree.by_id.get(span.parent_span_id)
        if parent is not None and not edge_allowed(span, parent):
            tree.forged += 1
            # Out of the tree: nothing reaches the root through it (its children are listed
            # under an id no walk visits, and `chain_to` stops at the missing id).
            del tree.by_id[span.span_id]
            continue
        tree.children.setdefault(span.parent_span_id, []).append(span)
    return tree


def _identity(span: SpanView) -> tuple:
    return (span.parent_span_id, span.name, span.start_epoch_ns, span.end_epoch_ns,
            span.kind, span.service)
