"""Replies never carry markup a sender typed (issue 15, finding 3): `neutralize`, applied once in
`FeishuSender`."""

from __future__ import annotations

import re

_AT_PAIR = re.compile(r"<\s*at\b([^>]*)>(.*?)<\s*/\s*at\s*>", re.I | re.S)
_AT_LONE = re.compile(r"<\s*/?\s*at\b([^>]*)>", re.I)
_ID = re.compile(r"""\b(?:user_id|open_id|id)\s*=\s*["']?([^"'\s>]*)""", re.I)
_TAG = re.compile(
    r"</?(?:a|b|i|u|s|em|strong|del|font|img|span|p|div|br|text_tag|link|button|md)\b[^>]*>", re.I
)
_LINK = re.compile(r"!?\[([^\[\]\n]*)\]\(\s*([^()\s]*(?:\([^()\s]*\)[^()\s]*)*)[^()\n]*\)")
_AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.\-]{1,31}:[^<>\s]*)>")
_REFDEF = re.compile(r"^(\s{0,3})\[([^\]\n]+)\]:", re.M)
_BRACKET_PAREN = re.compile(r"\]\s*\(")


def _at(match: re.Match[str], inner: str = "") -> str:
    found = _ID.search(match.group(1))
    ident = found.group(1) if found else ""
    name = " ".join(inner.split())
    if name:
        return name if name.startswith("@") else "@" + name
    if ident.lower() == "all":
        return "@所有人"
    return "@" + ident if ident else ""


def neutralize(text: str) -> str:
    """`text` with every Feishu mention, tag and link turned into plain words (docs/ARCHITECTURE.md,
    "Delivery"). Plain text is returned unchanged; running it twice changes nothing more."""
    if "<" not in text and "](" not in text and "]:" not in text and "] (" not in text:
        return text
    out = _AT_PAIR.sub(lambda m: _at(m, m.group(2)), text)
    out = _AT_LONE.sub(_at, out)
    out = _TAG.sub("", out)
    out = _AUTOLINK.sub(r"\1", out)
    for _ in range(8):  # nested links: [[a](x)](y) needs two passes
        new = _LINK.sub(lambda m: f"{m.group(1)} ({m.group(2)})" if m.group(2) else m.group(1), out)
        if new == out:
            break
        out = new
    out = _BRACKET_PAREN.sub("] (", out)  # whatever link syntax is left (too deeply nested) is broken
    out = _REFDEF.sub(r"\1\2:", out)
    return out


def attr(value: str) -> str:
    """An id safe inside a tag attribute the bot writes itself (open_ids are letters, digits, `_`)."""
    return re.sub(r"[^A-Za-z0-9_\-]", "", value)
