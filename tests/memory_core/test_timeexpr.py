from __future__ import annotations

from datetime import UTC, date, datetime

from memory_core.timeexpr import asks_when, resolved_dates, says_when

SAID = datetime(2023, 8, 30, 18, 0, tzinfo=UTC)  # a Wednesday


def days(text: str) -> list[date]:
    return [d.date() for d in resolved_dates(text, SAID)]


def test_relative_expressions_resolve_from_the_day_they_were_said() -> None:
    assert days("Yesterday my partner and I got back from Rio") == [date(2023, 8, 29)]
    assert days("We had a blast last year at the Pride fest") == [date(2022, 8, 28)]
    assert days("I adopted him two months ago") == [date(2023, 6, 28)]
    assert days("Last Saturday we went biking") == [date(2023, 8, 26)]
    assert days("Let's go next Saturday") == [date(2023, 9, 2)]
    assert days("a few weeks ago, and then next month") == [date(2023, 8, 9), date(2023, 9, 28)]
    assert days("Let's do it next month, in January") == [date(2023, 9, 28)]
    assert days("I love hiking") == []


def test_an_expression_outside_the_calendar_is_skipped() -> None:
    assert days("9999 years ago, and yesterday") == [date(2023, 8, 29)]
    assert days("99999999999 days ago") == []


def test_says_when_and_asks_when() -> None:
    assert says_when("I went hiking last weekend") and says_when("the other day")
    assert not says_when("Hiking with the hiking club is my favourite thing")
    assert asks_when("When did Ann go hiking?") and not asks_when("Where did Ann go hiking?")
