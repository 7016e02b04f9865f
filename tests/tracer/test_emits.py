"""The bounded emit summary (tracer/record/emits.py) and its histogram path
(tracer/sinks/gap_histogram.py): the same metrics as observing every gap, in fixed memory."""
from __future__ import annotations

import random
import sys

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from tracer.record.buckets import ITL_BUCKETS_S
from tracer.record.emits import MAX_SEND_TIMES, EmitLog, GapSummary
from tracer.record.timeline import Timeline
from tracer.sinks.gap_histogram import add_gap_summary

# Every bucket edge, exactly and one nanosecond either side, plus 0 and gaps above the ladder.
EDGE_GAPS_NS = sorted({g for b in ITL_BUCKETS_S for g in (round(b * 1e9) - 1, round(b * 1e9),
                                                          round(b * 1e9) + 1)} | {0, 10**12})


def _histogram_pair():
    registry = CollectorRegistry()
    h = Histogram("itl_seconds", "gaps", ["model"], registry=registry, buckets=ITL_BUCKETS_S)
    return registry, h.labels("a"), h.labels("b")


def _samples(registry, label):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in registry.collect() for s in m.samples if s.labels.get("model") == label}


@pytest.mark.parametrize("seed", range(6))
def test_bucket_counts_equal_observing_every_gap(seed):
    rng = random.Random(seed)
    gaps = [rng.choice(EDGE_GAPS_NS) if rng.random() < 0.3 else int(rng.lognormvariate(17, 2))
            for _ in range(rng.randint(1, 3000))]
    registry, one_by_one, summarised = _histogram_pair()
    for g in gaps:
        one_by_one.observe(g * 1e-9)
    add_gap_summary(summarised, GapSummary.of(gaps), exemplar=None)
    a, b = _samples(registry, "a"), _samples(registry, "b")
    assert {k[0] for k in a} == {k[0] for k in b}
    for (name, labels), value in a.items():
        other = b[(name, tuple((k, "b" if k == "model" else v) for k, v in labels))]
        if name.endswith("_created"):
            continue
        if name.endswith("_sum"):
            assert other == pytest.approx(value, rel=1e-9, abs=1e-12)
        else:
            assert other == value, (name, labels)


def test_every_edge_lands_where_observe_puts_it():
    for g in EDGE_GAPS_NS:
        registry, one_by_one, summarised = _histogram_pair()
        one_by_one.observe(g * 1e-9)
        add_gap_summary(summarised, GapSummary.of([g]), exemplar=None)
        a, b = _samples(registry, "a"), _samples(registry, "b")
        buckets_a = {dict(k[1])["le"]: v for k, v in a.items() if k[0].endswith("_bucket")}
        buckets_b = {dict(k[1])["le"]: v for k, v in b.items() if k[0].endswith("_bucket")}
        assert buckets_a == buckets_b, g


def test_the_exemplar_goes_on_the_largest_gap():
    registry, _, child = _histogram_pair()
    add_gap_summary(child, GapSummary.of([2_000_000, 700_000_000, 3_000_000]),
                    exemplar={"trace_id": "ab" * 16})
    text = generate_latest(registry).decode()
    assert "itl_seconds_count" in text
    bucket = child._buckets[ITL_BUCKETS_S.index(0.75)]
    assert bucket.get_exemplar().value == pytest.approx(0.7)


def test_a_histogram_of_other_buckets_is_refused():
    child = Histogram("x_seconds", "x", buckets=(1.0, 2.0), registry=CollectorRegistry())
    with pytest.raises(ValueError, match="ITL_BUCKETS_S"):
        add_gap_summary(child, GapSummary.of([5]), exemplar=None)


def test_summary_fields_match_the_gaps():
    gaps = [5_000_000, 1_000_000, 9_000_000] + [2_000_000] * 100
    s = GapSummary.of(gaps)
    assert (s.count, s.sum_ns, s.min_ns, s.max_ns) == (len(gaps), sum(gaps), min(gaps), max(gaps))
    assert s.mean_ns == sum(gaps) // len(gaps)
    assert s.first_ns == tuple(gaps[:MAX_SEND_TIMES - 1])
    assert sum(s.bucket_counts) == len(gaps)


def test_a_stream_of_any_length_keeps_the_same_memory():
    def footprint(num_emits: int) -> int:
        tl = Timeline(0)
        for i in range(num_emits):
            tl.emit(i * 1_000_000)
        snap = tl.snapshot()
        assert snap.num_emits == num_emits
        return (sys.getsizeof(snap.first_emits_ns) + sys.getsizeof(snap.gaps.first_ns)
                + sys.getsizeof(snap.gaps.bucket_counts))

    assert footprint(100_000) == footprint(MAX_SEND_TIMES)


def test_first_send_times_are_kept_exactly():
    log = EmitLog()
    times = [i * i * 1_000 for i in range(100)]
    for t in times:
        log.add(t)
    assert log.first_ns == times[:MAX_SEND_TIMES] and log.count == 100
