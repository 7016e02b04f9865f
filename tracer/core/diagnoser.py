"""The diagnosis of every finished record, on the tracer's worker thread.

`Diagnoser` is a deferred sink ahead of every exporter (`build_observability` puts it
there, after `ExportFields`, which hashes the prompt before this drops it): it judges each
record against its model's baselines (`tracer.record.verdict.judge`), sets
`record.verdict`, then feeds the record into the baselines and its prompt into the recent
prompts. The metrics, spans and log line, published after it on the same thread, read the
verdict from the record; `/ui` reads it from the store once the worker has passed
(docs/architecture.md, "Diagnosis").

It runs off the request's thread: the rule, the medians and the prompt overlap cost the
worker tens of µs a record and the request nothing. With `measure_cpu` set it adds
its thread's CPU to `cpu_ns`; off by default, because
reading a thread's CPU clock is a system call (~1 µs on a VM) twice a record. A queueing
or slow-prefill verdict also names its culprit: the neighbours its queue or prefill was
spent behind (`tracer.core.neighbourhood`, which reads the store, the requests in flight and
the engine's steps). Where those two rules had too
little history, the neighbours judge the stage instead, from the first request
(`tracer.record.behind_neighbours`). `judge_client` is the beacon join's half (network,
buffering).
"""
from __future__ import annotations

import time

from tracer.record import behind_neighbours
from tracer.record.baselines import Baselines
from tracer.record.diagnosis_signals import Context, Signals, observe
from tracer.record.prompt_overlap import RECENT_PIECES, FingerprintCache, RecentPrompts
from tracer.record.request_record import RequestRecord
from tracer.record.verdict import (
    Verdict,
    cause_window,
    culprit_window,
    floor_of,
    judge,
    judge_client,
    name_culprits,
    with_findings,
)


class Diagnoser:
    """Sets `record.verdict` on every record with a first token; see the module docstring.

    >>> from tracer.record.request_record import RequestRecord
    >>> diagnoser = Diagnoser()
    >>> record = RequestRecord("r1", "1" * 32, "2" * 16, "m", "chat", 0, 10, ttft_ns=5)
    >>> diagnoser.publish(record); record.verdict.cause
    'cold_path'
    """

    name = "diagnosis"   # in the tracer's sink failure counts

    def __init__(self, baselines: Baselines | None = None, *,
                 recent_pieces: int = RECENT_PIECES, neighbourhood=None,
                 measure_cpu: bool = False) -> None:
        self.baselines = Baselines() if baselines is None else baselines
        # Where a queueing or slow-prefill verdict finds its culprit
        # (tracer/core/neighbourhood.py); None: the verdict names none.
        self.neighbourhood = neighbourhood
        self._recent_pieces = recent_pieces
        self._recent: dict[str, RecentPrompts] = {}
        self._fingerprints = FingerprintCache()
        self.num_records = 0
        self.measure_cpu = measure_cpu
        self.cpu_ns = 0          # thread CPU spent judging, with `measure_cpu`

    def publish(self, record: RequestRecord) -> None:
        start_ns = time.thread_time_ns() if self.measure_cpu else 0
        try:
            self._diagnose(record)
        finally:
            record.prompt_source = None     # the prompt is never kept past this point
            if self.measure_cpu:
                self.cpu_ns += time.thread_time_ns() - start_ns
            self.num_records += 1

    def _diagnose(self, record: RequestRecord) -> None:
        if record.ttft_ns is None:
            return      # no first token, no TTFT to explain: the record carries no verdict
        fp = None
        if record.prompt_source is not None:
            fp = self._fingerprints.of(record.prompt_source)
        recent = self._recent.get(record.model)
        if recent is None:
            recent = self._recent[record.model] = RecentPrompts(self._recent_pieces)
        overlap = None if fp is None else recent.best_overlap(fp)
        with self.baselines.lock:
            baseline = self.baselines.of(record.model)
            context = Context.of(baseline, record.start_ns, overlap)
            signals = Signals.of(record)
            verdict = judge(record, baseline, context, signals)
            verdict = self._behind_neighbours(record, verdict, signals, baseline)
            verdict = self._with_culprits(record, verdict, signals)
            if record.client is not None:     # the beacon joined before the worker came
                verdict = self._with_client(verdict, record.client, baseline)
            record.verdict = verdict
            observe(baseline, record, signals)
        if fp is not None:
            recent.add(record.trace_id, fp)

    def learn(self, records) -> int:
        """Feed `records` (oldest first) into the baselines without judging them: the
        history a restarted process reads back from the store, so that the requests after a
        restart are judged against it at once. What says "this process is new" (the request
        count since start, the last end, behind `cold_path`) stays as it was. The number
        of records learnt."""
        learnt = 0
        with self.baselines.lock:
            for record in records:
                if record.ttft_ns is None or record.error_type is not None:
                    continue
                baseline = self.baselines.of(record.model)
                since_start, last_end_ns = baseline.num_requests, baseline.last_end_ns
                observe(baseline, record)
                baseline.num_requests, baseline.last_end_ns = since_start, last_end_ns
                learnt += 1
        return learnt

    def _behind_neighbours(self, record: RequestRecord, verdict: Verdict, signals: Signals,
                           baseline) -> Verdict:
        """The neighbours' findings for the stages whose rule had too little history; only
        with the engine's step record, whose blame is measured (not a fair share)."""
        causes = behind_neighbours.stages_to_ask(verdict.cold)
        if not causes or self.neighbourhood is None or self.neighbourhood.step_log_size is None:
            return verdict
        asked = {}
        for cause in causes:
            window = cause_window(record, cause)
            if window is not None:
                asked[cause] = (window[1] - window[0], self.neighbourhood.neighbours_of(
                    record, *window, recent_only=True))
        found = behind_neighbours.findings(signals, asked, floor_of(baseline, record.ttft_ns))
        return with_findings(verdict, found)

    def _with_culprits(self, record: RequestRecord, verdict: Verdict,
                       signals: Signals) -> Verdict:
        if verdict.evidence.get("num_neighbours") is not None:
            return verdict      # the neighbours' own finding: its culprits are named
        window = None if self.neighbourhood is None else culprit_window(record, verdict)
        if window is None:
            return verdict
        found = self.neighbourhood.neighbours_of(record, *window, recent_only=True)
        return name_culprits(verdict, found, window[1] - window[0], signals.uncached_tokens)

    def join_client(self, record: RequestRecord, client: dict) -> Verdict | None:
        """The record's verdict with its beacon's findings (network, buffering), also set on
        the record; the network baseline learns from the beacon. None when the record has
        not been judged yet (the worker then judges the beacon with it; a record without a
        first token never is) or was judged with its beacon already."""
        with self.baselines.lock:
            verdict = record.verdict
            if verdict is None or verdict.client_joined:
                return None
            joined = self._with_client(verdict, client, self.baselines.of(record.model))
            record.verdict = joined
        return joined

    @staticmethod
    def _with_client(verdict: Verdict, client: dict, baseline) -> Verdict:
        """Call with the baselines' lock held: the beacon is judged once, then learnt."""
        joined = judge_client(verdict, client, baseline)
        network_ms = client.get("network_overhead_ms")
        if isinstance(network_ms, (int, float)) and network_ms >= 0:
            baseline.add("network_ms", float(network_ms))
        return joined

    @property
    def us_per_record(self) -> float:
        """Thread CPU per record judged with `measure_cpu` on (0 without)."""
        return self.cpu_ns / 1e3 / self.num_records if self.num_records else 0.0
