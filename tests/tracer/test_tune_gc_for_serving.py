"""`tune_gc_for_serving` (tracer/web/server_options.py), what every front runs before serving:
what is alive then leaves the collector's walks and is still freed by reference counting, the
youngest generation's threshold is raised, and a cycle made later is still collected."""
from __future__ import annotations

import gc
import weakref

from tracer.web.server_options import GEN0_THRESHOLD, tune_gc_for_serving


class Thing:
    pass


def test_the_start_up_heap_is_frozen_and_still_freed_when_dropped():
    gc.unfreeze()
    thresholds = gc.get_threshold()
    kept = Thing()
    ref = weakref.ref(kept)
    try:
        tune_gc_for_serving()
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())   # out of every generation
        assert gc.get_threshold() == (GEN0_THRESHOLD, *thresholds[1:])
        del kept
        assert ref() is None                                   # refcounting still frees it
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_a_cycle_made_after_is_still_collected():
    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        tune_gc_for_serving()
        a, b = Thing(), Thing()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
