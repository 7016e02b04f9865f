"""What every `tracer trace` subcommand shares: one GET of a live server's `/ui/api/...` JSON
(the API key, bounded timeouts, each way it can fail as an error the CLI prints: exit 2),
and bounded whole-number arguments."""
from __future__ import annotations

import argparse
from collections.abc import Callable

_CONNECT_TIMEOUT_S = 5.0


def get_json(base_url: str, path: str, params: dict, api_key: str | None, *,
             timeout_s: float) -> object:
    """The parsed body of `GET base_url + path`; OSError when nothing answers, ValueError
    for any answer but a 200 of JSON."""
    import httpx   # only the live modes need it

    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    url = f"{base_url.rstrip('/')}{path}"
    try:
        response = httpx.get(url, params=params, headers=headers,
                             timeout=httpx.Timeout(timeout_s, connect=_CONNECT_TIMEOUT_S))
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise OSError(f"{base_url}: no answer ({type(exc).__name__}: {exc})") from exc
    if response.status_code != 200:
        hint = " (give --api-key)" if response.status_code in (401, 403) else ""
        raise ValueError(f"{base_url} answered {response.status_code}{hint}: "
                         f"{response.text[:300]}")
    try:
        return response.json()
    except ValueError as exc:
        raise ValueError(f"{url} did not answer JSON") from exc


def bounded_int_arg(low: int, high: int, unit: str) -> Callable[[str], int]:
    """An argparse `type`: a whole number of `unit` from `low` to `high`.

    >>> bounded_int_arg(0, 10, "ms")("7")
    7
    """
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of {unit}") \
                from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low} to {high:,} {unit}")
        return value
    return parse
