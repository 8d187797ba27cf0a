"""Reading request headers that strangers write: a header that is not UTF-8 is refused, never a 500."""

from __future__ import annotations

from collections.abc import Mapping

from workers.errors import BadHeader


def text_header(headers: Mapping[str, str], name: str) -> str:
    """The header's value ('' when absent). Raises BadHeader when its bytes were not UTF-8.

    aiohttp decodes header bytes as UTF-8 with `surrogateescape`, so a non-UTF-8 byte arrives as a lone
    surrogate that fails the first `.encode()` (issue 15: a 500 with a traceback for a bad
    `X-Lark-Request-Timestamp`, `-Nonce` or `Authorization`).
    """
    value = headers.get(name, "")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadHeader(name) from exc
    return value
