"""Reading request headers that strangers write: a header that is not UTF-8 is refused, never a 500."""

from __future__ import annotations

from collections.abc import Mapping

from workers.errors import BadHeader


def text_header(headers: Mapping[str, str], name: str) -> str:
    """The header's value ('' when absent). Raises BadHeader when its bytes were not UTF-8 (aiohttp
    hands them on as lone surrogates, which made a 500 in issue 15)."""
    value = headers.get(name, "")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadHeader(name) from exc
    return value
