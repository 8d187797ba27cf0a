"""Time expressions in chat turns, English and Chinese: whether a turn says when ("last week", 上周), the dates
those words point at from the day it was said, whether a question asks "when", and written dates (5月2日, May 2)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
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
MONTHS = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)  # fmt: skip

_COUNT = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "eight": 8, "nine": 9, "ten": 10, "few": 3, "a few": 3, "couple of": 2, "a couple of": 2,
          "several": 3}  # fmt: skip
_SHIFT = re.compile(
    rf"\b(?:(yesterday|tomorrow)|(last|next) (week|weekend|month|year|{_WEEKDAY})|"
    rf"({_NUM}) (day|week|month|year)s? ago)\b",
    re.I,
)


# --- Chinese: general grammar. Counts are digits or 一..十 and 两; 几 ("a few") is 3 like "few". Weeks
# run Monday to Sunday: 上周六 is the Saturday of the week before the turn's.
_ZH_NUMERALS = {"〇": 0, "零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8,
                "九": 9, "几": 3}  # fmt: skip
_ZH_WEEKDAYS = "一二三四五六日"  # 天 is 日 (Sunday)
_ZH_WEEKDAY = r"(?:一(?![起些直定样般点下次个共切])|[二三四五六日天])"  # 上周一起 is "together last week"
_ZH_WEEK = r"(?:周|星期|礼拜)"
# A count starts where its run of digits or numerals starts, and is at most 4 long: searched at every
# position of a long digit run, an unbounded count made the scan quadratic (100,000 digits: minutes).
_ZH_COUNT = r"(?<![\d一二两三四五六七八九十几])(?:\d{1,4}|[一二两三四五六七八九十几]{1,4}|半)"  # 半: half
#: A Chinese relative time expression; the named groups are what `resolved_dates` resolves.
ZH_RELATIVE = re.compile(
    r"(?P<day>大前天|前天|昨[天日晚]|明[天日晚]|大后天|后天|前几天|前些天)|"
    r"今[天日晚早]|最近|近来|前段时间|前阵子|这个?月|本月|今年|"
    rf"(?P<wrel>上上|下下|[上下这本])一?个?{_ZH_WEEK}(?:(?P<wd>{_ZH_WEEKDAY})|(?![围边到期年]))|"
    rf"(?<![\d一二两三四五六七八九十几每个]){_ZH_WEEK}(?P<bare>{_ZH_WEEKDAY})|"
    r"(?P<mrel>上上|下下|[上下])一?个?月|"
    r"(?<![以之最])(?P<yrel>[去前明后])年(?![轻纪龄级])|"
    rf"(?P<num>{_ZH_COUNT})(?P<unit>个?多?(?:天|周|星期|礼拜|年)|个多?月)多?[以之]?(?P<dir>[前后])"
)
ZH_ASKS_WHEN = re.compile(
    r"什么时候|啥时候|什么时间|何时|哪一?天|哪一?年|哪个月|哪个?星期|几月|几号|星期几|周几|礼拜几|多久以?前"
)
_ZH_DAY_SHIFT = {"大前天": -3, "前天": -2, "前几天": -3, "前些天": -3, "后天": 2, "大后天": 3}
_ZH_YEAR_SHIFT = {"去": -1, "前": -2, "明": 1, "后": 2}
_ZH_STEP = {"上": -1, "下": 1, "上上": -2, "下下": 2}  # 上上周: the week before last
_Y = r"(\d{4}|[〇零一二三四五六七八九]{4})\s*年"
_M = r"(\d{1,2}|[一二三四五六七八九十]{1,3})\s*月份?"
_D = r"(?:\s*(\d{1,2}|[一二三四五六七八九十]{1,4})\s*[日号])?"
# A day in digits with no month (6号): 号 also numbers things (3号楼, 1号线, 5号选手), named by the word after.
_BARE_DAY = r"(?<![\d.第A-Za-z])(\d{1,2})\s*[日号](?![\d线楼房室门床车厅位座机球码台店馆院选游元])"
#: A date written the Chinese way: 2023年5月2日, 5月2号, 五月二日, 五月份, 2023年5月, 2023年, or a day alone (6号).
ZH_DATE = re.compile(rf"(?<![\d.]){_Y}(?:\s*{_M}{_D})?|(?<![\d.]){_M}{_D}|{_BARE_DAY}")
_MON = f"({'|'.join(MONTHS)}|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)"
_EN_DAY = r"\b(?<![:./-])(\d{1,2})(?:st|nd|rd|th)?\b(?![:.]\d)"
_EN_YEAR = r"(?:,?\s{1,3}((?:19|20)\d{2})\b)?"
_SPACE = r"\s{1,3}"
#: A date written the English way: May 2, May 2nd, 2023, 2 May, 2nd of May, March 2023, in March. Every
#: repeat is bounded, so a scan costs a constant per starting position.
EN_DATE = re.compile(
    rf"\b{_MON}\b\.?{_SPACE}{_EN_DAY}{_EN_YEAR}|{_EN_DAY}{_SPACE}(?:of{_SPACE})?{_MON}\b{_EN_YEAR}|"
    rf"\b{_MON}\b\.?{_SPACE}((?:19|20)\d{{2}})\b|"
    rf"\b(?:in|since|during|until|till|by|early|late|mid)(?:-|{_SPACE}){_MON}\b{_EN_YEAR}",
    re.I,
)
#: A date in digits, year first (2023-05-02, 2023/5/2, 2023.5.2), the one order nobody reads two ways;
#: a short 5/2, a version or part of a longer run of numbers (v2023.5.2, 2023.5.2.1) is not read.
NUM_DATE = re.compile(r"(?<![\dA-Za-z./-])((?:19|20)\d{2})([-/.])(\d{1,2})\2(\d{1,2})(?!\d|[./-]\d)")
# May and March are also a modal and a verb: as months they are capitalised and follow no pronoun (I May 2...).
_VERB_MONTHS = {"may", "mar", "march"}
_PRONOUN = re.compile(r"\b(?:i|you|we|they|he|she|it|who)\s*$", re.I)


def says_when(text: str) -> bool:
    """Whether a turn's own words hold a relative time expression or a written date (5月2日, 6号, May 2,
    2023-05-02)."""
    return RELATIVE.search(text) is not None or ZH_RELATIVE.search(text) is not None or any(_written(text))


def asks_when(question: str) -> bool:
    return ASKS_WHEN.search(question) is not None or ZH_ASKS_WHEN.search(question) is not None


def date_words(when: datetime, *, day: bool = True) -> str:
    """The canonical words a date is indexed by, whatever the language it was written in: "2023 may 2"."""
    return f"{when.year} {MONTHS[when.month - 1]}" + (f" {when.day}" if day else "")


def written_dates(text: str, said: datetime | None = None) -> list[str]:
    """The dates `text` writes, spelt as `date_words` (2023年5月2日 → "2023 may 2"), a day alone (6号)
    in the month `said` is in; dates outside the calendar are skipped."""
    out: list[str] = []
    for year, month, day in _written(text):
        if month is None and day:  # a day alone
            if said is None:
                continue
            try:
                out.append(date_words(said.replace(day=day)))
            except ValueError:
                continue
        else:
            words = [str(year)] if year else []
            words += [MONTHS[month - 1]] if month else []
            out.append(" ".join(words + ([str(day)] if day else [])))
    return out


def _written(text: str) -> Iterator[tuple[int | None, int | None, int | None]]:
    """(year, month, day) of each date written in `text`, a part not written None (a day alone: 6号)."""
    if "月" in text or "年" in text or "日" in text or "号" in text:
        for found in ZH_DATE.finditer(unicodedata.normalize("NFKC", text)):
            year, month, day, month2, day2, bare = found.groups()
            try:
                y = _zh_int(year) if year else None
                m, d = (_zh_int(month or month2) if month or month2 else None), day or day2 or bare
                dd = _zh_int(d) if d else None
                datetime(y or 2000, m or 1, dd or 1)  # 2000: a leap year, so 2月29日 stands
            except ValueError:
                continue
            if y or m or dd:
                yield y, m, dd
    for found in NUM_DATE.finditer(text):
        y, m, dd = int(found[1]), int(found[3]), int(found[4])
        try:
            datetime(y, m, dd)
        except ValueError:
            continue
        yield y, m, dd
    for found in EN_DATE.finditer(text):
        mon1, day1, year1, day2, mon2, year2, mon3, year3, mon4, year4 = found.groups()
        mon = mon1 or mon2 or mon3 or mon4
        if mon.casefold() in _VERB_MONTHS and (
            not mon[0].isupper() or _PRONOUN.search(text, max(0, found.start() - 6), found.start())
        ):
            continue
        m = next(i for i, name in enumerate(MONTHS, 1) if name.startswith(mon.casefold()[:3]))
        year, day = year1 or year2 or year3 or year4, day1 or day2
        y, dd = (int(year) if year else None), (int(day) if day else None)
        try:
            datetime(y or 2000, m, dd or 1)
        except ValueError:
            continue
        yield y, m, dd


def _zh_int(text: str) -> int:
    """A count or date number in digits or Chinese numerals (二〇二三, 十二, 二十三, 几); ValueError if not."""
    if text.isdigit():
        return int(text)
    if "十" not in text:
        if not text or any(ch not in _ZH_NUMERALS for ch in text):
            raise ValueError(text)
        return int("".join(str(_ZH_NUMERALS[ch]) for ch in text)) if len(text) > 1 else _ZH_NUMERALS[text]
    tens, _, ones = text.partition("十")
    if "十" in ones or len(tens) > 1 or len(ones) > 1:
        raise ValueError(text)
    return (_zh_int(tens) if tens else 1) * 10 + (_zh_int(ones) if ones else 0)


def _months_later(ts: datetime, n: int) -> datetime:
    y, m = divmod(ts.year * 12 + ts.month - 1 + n, 12)
    return ts.replace(year=y, month=m + 1, day=min(ts.day, 28))


def resolved_dates(text: str, said: datetime) -> list[datetime]:
    """The dates a turn's relative expressions point at from when it was said ("yesterday", "last
    year"); one outside the calendar is skipped."""
    out: list[datetime] = []
    for found in _SHIFT.finditer(text):
        try:
            out.append(_resolve(*(x.lower() if x else "" for x in found.groups()), said=said))
        except (ValueError, OverflowError):
            continue
    for zh in ZH_RELATIVE.finditer(text):
        try:
            when = _resolve_zh(zh, said)
        except (ValueError, OverflowError):
            continue
        if when is not None:
            out.append(when)
    return out


def _resolve_zh(found: re.Match[str], said: datetime) -> datetime | None:
    """The date one Chinese expression points at (None for one that points at no other day: 今天, 最近)."""
    g = found.groupdict()
    if g["day"]:
        return said + timedelta(days=_ZH_DAY_SHIFT.get(g["day"], -1 if g["day"][0] == "昨" else 1))
    if g["wrel"] or g["bare"]:
        weeks = _ZH_STEP.get(g["wrel"] or "", 0)
        wd = g["wd"] or g["bare"]
        if wd is None:
            return said + timedelta(days=7 * weeks) if weeks else None
        monday = said - timedelta(days=said.weekday())
        return monday + timedelta(days=7 * weeks + _ZH_WEEKDAYS.index("日" if wd == "天" else wd))
    if g["mrel"]:
        return _months_later(said, _ZH_STEP[g["mrel"]])
    if g["yrel"]:
        return _months_later(said, 12 * _ZH_YEAR_SHIFT[g["yrel"]])
    if g["num"]:
        unit, sign = g["unit"].strip("个多"), -1 if g["dir"] == "前" else 1
        if g["num"] == "半":  # 半年: six months, 半个月: fifteen days; half a day or week: no other date
            if unit == "年":
                return _months_later(said, 6 * sign)
            return said + timedelta(days=15 * sign) if unit == "月" else None
        n = _zh_int(g["num"])
        if unit == "年":
            if n >= 1000:  # 1998年前 is "before 1998", a calendar year, not a count
                return None
            return _months_later(said, sign * 12 * n)
        if unit == "月":
            return _months_later(said, sign * n)
        return said + timedelta(days=sign * n * (1 if unit == "天" else 7))
    return None


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
