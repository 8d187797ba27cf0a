"""Why a raw-archive search hit matched: the query's terms in the line itself, or in the turns around it
(the index scores a line with its neighbours); `lucid search` prints it under every hit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .lineformat import RawMessage, format_time
from .recall import strong_terms
from .textindex import tokenize


@dataclass(frozen=True)
class Why:
    matched: list[str]  # the query's terms in the line itself
    partial: bool  # only single characters of a CJK word (咖 of 咖啡), no whole term
    context: RawMessage | None = (
        None  # the neighbouring turn that holds the query's terms, if the line lacks them
    )
    context_matched: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.matched and not self.partial:
            return "matched " + ", ".join(self.matched)
        if self.context is not None:
            head = f"partly matched {', '.join(self.matched)}; " if self.matched else ""
            said = " ".join(self.context.text.split())[:80]
            return (
                f"{head}the query's terms ({', '.join(self.context_matched)}) are in the context turn "
                f"{self.context.id} — {self.context.speaker}: {said}"
            )
        if self.matched:
            return "partly matched " + ", ".join(self.matched) + " (not the whole term)"
        return "no term of the query in this line or its context (ranked by similarity only)"

    def context_json(self) -> dict[str, Any] | None:
        if self.context is None:
            return None
        return {
            "id": self.context.id,
            "speaker": self.context.speaker,
            "ts": format_time(self.context.ts),
            "text": self.context.text,
            "matched": self.context_matched,
        }


def _terms(query: str, text: str) -> tuple[list[str], bool]:
    """(the query's terms in `text`, best first: whole words / CJK pairs, else single characters; partial)."""
    strong = sorted(strong_terms(query) & strong_terms(text))
    if strong:
        return strong, False
    asked = dict.fromkeys(tokenize(query))
    have = set(tokenize(text))
    singles = [t for t in asked if t in have]
    return singles, bool(singles) and bool(strong_terms(query))


def explain(query: str, text: str, around: Sequence[RawMessage]) -> Why:
    matched, partial = _terms(query, text)
    if matched and not partial:
        return Why(matched, False)
    for other in around:
        got, part = _terms(query, other.text)
        if got and not part:
            return Why(matched, partial, other, got)
    return Why(matched, partial)
