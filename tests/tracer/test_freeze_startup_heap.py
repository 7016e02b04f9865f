"""`freeze_startup_heap` (tracer/web/server_options.py), what every front runs before serving:
what is alive then leaves the collector's walks, and is still freed by reference counting."""
from __future__ import annotations

import gc
import weakref

from tracer.web.server_options import freeze_startup_heap


class Thing:
    pass


def test_the_start_up_heap_is_frozen_and_still_freed_when_dropped():
    gc.unfreeze()
    kept = Thing()
    ref = weakref.ref(kept)
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())   # out of every generation
        del kept
        assert ref() is None                                   # refcounting still frees it
    finally:
        gc.unfreeze()
