"""What the CLI prints to an operator's terminal: text that strangers wrote, made inert (`printable`)."""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control, C1 and bidi-override character written as `\\xNN` / `\\uNNNN`,
    so a message cannot recolour, rewrite or reorder what the CLI shows (issue 15)."""
    return _UNSAFE.sub(_escape, text)


def printable_json(text: str) -> str:
    """JSON text (from `json.dumps(…, ensure_ascii=False)`) with the same characters as JSON escapes: the
    document means the same, and the terminal shows it inert (C0 controls are escaped by json already)."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
