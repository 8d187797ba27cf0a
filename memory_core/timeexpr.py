"""Time expressions in chat turns: whether a turn says when ("yesterday", "last week", "two months ago"),
the dates those words point at from the day the turn was said, and whether a question asks "when"."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

_NUM = (
    r"(?:a|an|one|two|three|four|five|six|seven|eight|nine|ten|few|a few|couple of|a couple of|several|\d+)"
)
_UNIT = r"(?:day|week|weekend|month|year|night|morning|evening)s?"
_SEASON = r"(?:summer|winter|spring|fall|autumn)"
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAY = f"(?:{'|'.join(WEEKDAYS)})"

#: A relative time expression: general English, not drawn from any benchmark's questions.
RELATIVE = re.compile(
    rf"\b(?:yesterday|today|tonight|tomorrow|recently|lately|the other day|"
    rf"(?:last|next|this|past|coming) (?:{_UNIT}|{_SEASON}|{_WEEKDAY}|few {_UNIT}|couple of {_UNIT})|"
    rf"{_NUM} {_UNIT} (?:ago|back|before|later)|(?:a while|ages|long) ago|"
    rf"(?:in|for|over) (?:the )?(?:past|last|next) {_NUM}? ?{_UNIT})\b",
    re.I,
)
ASKS_WHEN = re.compile(r"\bwhen\b", re.I)

_COUNT = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "eight": 8, "nine": 9, "ten": 10, "few": 3, "a few": 3, "couple of": 2, "a couple of": 2,
          "several": 3}  # fmt: skip
_SHIFT = re.compile(
    rf"\b(?:(yesterday|tomorrow)|(last|next) (week|weekend|month|year|{_WEEKDAY})|"
    rf"({_NUM}) (day|week|month|year)s? ago)\b",
    re.I,
)


def says_when(text: str) -> bool:
    """Whether a turn's own words hold a relative time expression."""
    return RELATIVE.search(text) is not None


def asks_when(question: str) -> bool:
    return ASKS_WHEN.search(question) is not None


def _months_later(ts: datetime, n: int) -> datetime:
    y, m = divmod(ts.year * 12 + ts.month - 1 + n, 12)
    return ts.replace(year=y, month=m + 1, day=min(ts.day, 28))


def resolved_dates(text: str, said: datetime) -> list[datetime]:
    """The dates a turn's relative expressions point at from when it was said: "yesterday" on 2023-08-30
    is 2023-08-29, "last year" 2022, "two months ago" June, "last Saturday" the Saturday before. An
    expression pointing outside the calendar ("9999 years ago") is skipped."""
    out: list[datetime] = []
    for found in _SHIFT.finditer(text):
        try:
            out.append(_resolve(*(x.lower() if x else "" for x in found.groups()), said=said))
        except (ValueError, OverflowError):
            continue
    return out


def _resolve(day: str, rel: str, unit: str, num: str, unit2: str, *, said: datetime) -> datetime:
    if day:
        return said + timedelta(days=-1 if day == "yesterday" else 1)
    if rel:
        sign = -1 if rel == "last" else 1
        if unit in ("week", "weekend"):
            return said + timedelta(days=7 * sign)
        if unit in ("month", "year"):
            return _months_later(said, sign * (12 if unit == "year" else 1))
        wd = WEEKDAYS.index(unit)  # a weekday: the one before, or the one after
        back, ahead = (said.weekday() - wd) % 7 or 7, (wd - said.weekday()) % 7 or 7
        return said + timedelta(days=-back if sign < 0 else ahead)
    n = int(num) if num.isdigit() else _COUNT.get(num, 1)
    if unit2 in ("day", "week"):
        return said - timedelta(days=n * (7 if unit2 == "week" else 1))
    return _months_later(said, -n * (12 if unit2 == "year" else 1))
