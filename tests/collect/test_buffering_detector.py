"""The buffering detector on synthetic send/arrival series (tracer/web/probe/buffering.py)."""
from __future__ import annotations

import pytest

from tracer.web.probe.buffering import (MAX_ARRIVAL_SHARE, MIN_EVENTS, MIN_SEND_SPREAD_MS,
                                        detect_buffering)

# A token every 40 ms for 32 events: 1,240 ms of send spread.
SEND = [100.0 + 40.0 * i for i in range(32)]


def test_a_stream_that_arrives_as_it_was_sent_is_not_buffered():
    jittered = [s + 30.0 + (7.0 if i % 3 else -4.0) for i, s in enumerate(SEND)]
    verdict = detect_buffering(SEND, jittered)
    assert verdict.buffered is False and verdict.num_events == 32
    assert verdict.held_back_ms == pytest.approx(max(0.0, (SEND[-1] - SEND[0])
                                                     - (jittered[-1] - jittered[0])))


def test_everything_released_at_once_is_buffered_with_the_whole_spread_held_back():
    burst = [2_000.0 + 0.01 * i for i in range(32)]     # all in one read
    verdict = detect_buffering(SEND, burst)
    assert verdict.buffered is True
    assert verdict.held_back_ms == pytest.approx(1_240.0 - 0.31)


def test_a_buffer_that_releases_in_a_few_large_bursts_is_buffered():
    # nginx's default 4k/8k buffers: released every ~12 events.
    bursts = [500.0 + 480.0 * (i // 12) for i in range(32)]
    assert detect_buffering(SEND, bursts).buffered is False   # 960 of 1,240 ms still seen
    first_half = detect_buffering(SEND[:12], bursts[:12])      # one burst: all together
    assert first_half.buffered is True


def test_fewer_than_three_comparable_events_cannot_be_judged():
    assert detect_buffering([], []) is None
    assert detect_buffering(SEND[:2], [5.0, 5.0]) is None
    # k is the shorter list: 32 sends but 2 arrivals reported.
    assert detect_buffering(SEND, [5.0, 5.0]) is None
    assert MIN_EVENTS == 3 and detect_buffering(SEND[:3], [5.0, 5.0, 5.0]).num_events == 3


def test_equal_times_are_not_buffering():
    # Sent in one step (one engine step's output) and received together: nothing held back.
    assert detect_buffering([50.0] * 5, [80.0] * 5).buffered is False
    assert detect_buffering([50.0] * 5, [80.0] * 5).held_back_ms == 0.0


def test_the_thresholds_are_edges():
    send = [0.0, MIN_SEND_SPREAD_MS / 2, MIN_SEND_SPREAD_MS]
    at_share = [10.0, 10.0, 10.0 + MAX_ARRIVAL_SHARE * MIN_SEND_SPREAD_MS]
    assert detect_buffering(send, at_share).buffered is False          # not below the share
    below = [10.0, 10.0, 10.0 + MAX_ARRIVAL_SHARE * MIN_SEND_SPREAD_MS - 0.001]
    assert detect_buffering(send, below).buffered is True
    short = [0.0, 20.0, MIN_SEND_SPREAD_MS - 0.001]                  # too short to tell
    assert detect_buffering(short, [10.0, 10.0, 10.0]).buffered is False


def test_arrivals_stretched_more_than_sent_are_not_negative_held_back():
    verdict = detect_buffering([0.0, 10.0, 60.0], [0.0, 100.0, 400.0])
    assert verdict.buffered is False and verdict.held_back_ms == 0.0
