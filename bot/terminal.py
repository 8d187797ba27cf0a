"""What the CLI prints to an operator's terminal: text that strangers wrote, made inert (`printable`)."""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control, C1 and bidi-override character written as `\\xNN` / `\\uNNNN`.

    A message can carry terminal escapes (ESC [ … to recolour, move the cursor, retitle the window or rewrite a
    line already shown), a bare carriage return or backspaces that overwrite what came before, C1 controls that
    some terminals obey like ESC, and bidirectional overrides that reorder what the eye reads. `lucid show`,
    `search`, `recall` and `history` print such text; each of those characters is shown as a visible escape
    instead (issue 15). Newlines and tabs of the CLI's own layout stay.
    """
    return _UNSAFE.sub(_escape, text)


def printable_json(text: str) -> str:
    """JSON text (from `json.dumps(…, ensure_ascii=False)`) with the same characters as JSON escapes: the
    document means the same, and the terminal shows it inert (C0 controls are escaped by json already)."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
