from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memory_core.book import Book
from memory_core.ops import Remember
from memory_core.timeline import subject_timelines

T0 = datetime(2026, 6, 1, tzinfo=UTC)


def test_timeline_follows_the_supersede_chain() -> None:
    book = Book()
    for i, text in enumerate(["我在余杭区", "我搬到西湖区了", "我又回到余杭区了"]):
        book.apply(Remember(text=text), T0 + timedelta(days=20 * i))
    book.apply(Remember(text="我在阿里巴巴工作"), T0)
    first = book.entries()[0]
    book.move_to_archive(first.id)
    lines = subject_timelines(book.entries(), book.archived())
    chain = [s.entry.text for s in lines["所在地"]]
    assert chain == ["我在余杭区", "我搬到西湖区了", "我又回到余杭区了"]
    assert lines["所在地"][0].archived and lines["所在地"][0].end == T0 + timedelta(days=20)
    assert lines["所在地"][-1].end is None
    assert next(iter(lines)) == "所在地" and "雇主" in lines
