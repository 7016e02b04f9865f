"""schemathesis CLI hooks for test_schemathesis.py (loaded through `SCHEMATHESIS_HOOKS`): a
generated completion's token budget is capped before it is sent (generation_cap.py)."""
from __future__ import annotations

import schemathesis

from generation_cap import cap_generation


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    cap_generation(case.body)
