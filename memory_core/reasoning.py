"""A reasoning model's scratchpad, and how to take it out of an answer (`strip_reasoning`)."""

from __future__ import annotations

import re

_BLOCK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.S | re.I)
_OPEN = re.compile(r"<(?:think|thinking|reasoning)>", re.I)
_CLOSE = re.compile(r"</(?:think|thinking|reasoning)>", re.I)


def strip_reasoning(content: str) -> str:
    """`content` without a reasoning model's scratchpad (unchanged when it has none)."""
    if not (_OPEN.search(content) or _CLOSE.search(content)):
        return content
    text = _BLOCK.sub("", content)
    closes = list(_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end() :]
    opened = _OPEN.search(text)
    if opened is not None:
        text = text[: opened.start()]
    return text.strip()


_TAGS = ("<think>", "<thinking>", "<reasoning>")


def strip_partial(text: str) -> str:
    """What may be shown of an answer still arriving: `strip_reasoning`, also while a block is open, and a
    tag still arriving (`<`, `<th`, … split over stream chunks) held back until it is known not to be one."""
    shown = strip_reasoning(text)
    cut = shown.rfind("<")
    if cut >= 0 and any(tag.startswith(shown[cut:].lower()) for tag in _TAGS):
        shown = shown[:cut]
    return shown.strip()
