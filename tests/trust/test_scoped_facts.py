"""What is said about one chat stays that chat's: 我在这个群的代号是… in group A and in group B are two current
facts, each found where it was said; what is said about the person (where they live) is one fact wherever it
is said, and the newer statement supersedes. Found by the positive isolation checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memory_core.book import Book
from memory_core.ops import Remember
from memory_core.recall import visible_in

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
A, B = "g:oc_group_a", "g:oc_group_b"


def _current_in(book: Book, chat: str, when: datetime) -> list[str]:
    return [e.text for e in book.current(when) if visible_in(e, "group", chat)]


@pytest.mark.parametrize(
    ("in_a", "in_b"),
    [
        ("我在这个群的代号是青龙", "我在这个群的代号是白虎"),
        ("我在本群负责周报", "我在本群负责发版"),
        ("In this group my nickname is Falcon", "In this group my nickname is Otter"),
        ("我在这个群的代号是青龙", "我在这个群的代号是青龙"),  # the same words in two groups: two facts
    ],
)
def test_a_statement_about_one_group_never_ends_what_was_said_in_another(in_a: str, in_b: str) -> None:
    book = Book()
    first = book.apply(Remember(text=in_a, scope=A), T0)
    second = book.apply(Remember(text=in_b, scope=B), T0 + timedelta(days=1))
    assert first.status == "added" and second.status == "added", (first, second)
    later = T0 + timedelta(days=2)
    assert _current_in(book, "oc_group_a", later) == [in_a]
    assert _current_in(book, "oc_group_b", later) == [in_b]


def test_where_a_person_lives_is_one_fact_wherever_it_is_said() -> None:
    book = Book()
    book.apply(Remember(text="我住在余杭区", scope="p2p"), T0)
    moved = book.apply(Remember(text="我住在富阳区", scope=A), T0 + timedelta(days=1))
    assert moved.status.startswith("superseded")
    assert [e.text for e in book.current(T0 + timedelta(days=2))] == ["我住在富阳区"]
