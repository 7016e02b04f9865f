"""The bounds of a timeline window, read by the server's routes (tracer/web/ui_timeline.py),
the neighbourhood that answers them and `python -m tracer trace` (docs/reference.md,
"Timeline and neighbours")."""
from __future__ import annotations

DEFAULT_PAD_MS = 2_000          # a request's window: its server interval, this much each side
MAX_PAD_MS = 600_000
MAX_WINDOW_MS = 3_600_000       # a window by times: at most an hour
MAX_WINDOW_REQUESTS = 2_000     # past these, the newest are kept and the rest counted
MAX_WINDOW_STEPS = 10_000
