"""Where a forward pass ends on the device: the sync the engine calls before stamping it."""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def _no_sync() -> None:
    """CPU kernels run synchronously: when `execute` returns, the logits exist."""


def device_sync_for(device: torch.device | str) -> Callable[[], None]:
    """What waits for the device's queued kernels: `torch.cuda.synchronize` on CUDA (kernels
    are asynchronous, so the forward pass's end is only known after it), a no-op elsewhere.

    >>> device_sync_for("cpu") is _no_sync
    True
    """
    device = torch.device(device)
    if device.type == "cuda":
        return functools.partial(torch.cuda.synchronize, device)
    return _no_sync
