from __future__ import annotations

from datetime import UTC, date, datetime

from memory_core.timeexpr import asks_when, date_words, resolved_dates, says_when, written_dates

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


def test_chinese_relative_expressions_resolve_from_the_day_they_were_said() -> None:
    assert days("昨天我和男朋友从里约回来了") == [date(2023, 8, 29)]
    assert days("前天下了雨，后天要出差") == [date(2023, 8, 28), date(2023, 9, 1)]
    assert days("去年我们去了骄傲节") == [date(2022, 8, 28)]
    assert days("前年搬的家，明年想换工作") == [date(2021, 8, 28), date(2024, 8, 28)]
    assert days("我两个月前领养了它") == [date(2023, 6, 28)]
    assert days("三天前、两周前、一年前、几天前") == [
        date(2023, 8, 27), date(2023, 8, 16), date(2022, 8, 28), date(2023, 8, 27)
    ]  # fmt: skip
    assert days("一个多月前开始学的") == [date(2023, 7, 28)]
    assert days("上个月去了杭州，下个月去成都") == [date(2023, 7, 28), date(2023, 9, 28)]
    # Weeks run Monday to Sunday: 上周六 is the Saturday of the week before, 这周五 this week's Friday.
    assert days("上周六我们去骑车") == [date(2023, 8, 26)]
    assert days("上星期天") == [date(2023, 8, 27)] and days("下礼拜一") == [date(2023, 9, 4)]
    assert days("这周五见") == [date(2023, 9, 1)] and days("星期二") == [date(2023, 8, 29)]
    assert days("上周一起吃了饭") == [date(2023, 8, 23)]  # 一起 is "together", not Monday
    assert days("今天和最近都很忙") == []  # no other day
    assert days("我喜欢爬山") == [] and days("我以前年轻的时候") == [] and days("从前年轻的时候") == []
    assert days("之前年会上见过") == []  # 之前 + 年会 (an annual meeting), not 前年
    assert days("12月前交报告") == []  # a calendar month (before December), not "12 months ago"


def test_a_chinese_expression_outside_the_calendar_is_skipped() -> None:
    assert days("99999999天前，还有昨天") == [date(2023, 8, 29)]
    assert days("9999年前") == [] and days("1998年前后") == []  # a calendar year, not a count of years


def test_chinese_says_when_and_asks_when() -> None:
    assert says_when("我上周去爬山了") and says_when("两个月前") and says_when("我5月2日去了博物馆")
    assert not says_when("天气很好，我们去爬山") and not says_when("小时候我住在乡下")
    assert not says_when("这周围很安静") and not says_when("每周一次") and not says_when("每周六都去游泳")
    for question in ("我什么时候去的杭州", "啥时候买的", "哪天下的雨", "那是哪一年", "几号出发", "几月去的"):
        assert asks_when(question), question
    for question in ("我去了哪里", "小时候我喜欢什么", "有时候我会跑步", "我跑了几天", "天气怎么样"):
        assert not asks_when(question), question


def test_dates_written_the_chinese_way_are_spelt_as_the_index_spells_a_day() -> None:
    assert written_dates("我曾经在5月2日提到过") == ["may 2"] == written_dates("五月二号")
    assert written_dates("在4月27号这天") == ["april 27"]
    assert written_dates("我五月份去了哪里") == ["may"]
    assert written_dates("2023年5月") == ["2023 may"] and written_dates("2023年") == ["2023"]
    assert written_dates("二〇二三年十二月二十五日") == ["2023 december 25"]
    assert written_dates("１２月３日") == ["december 3"]  # full-width digits
    assert (
        written_dates("date_words") == [] and written_dates("三个月") == [] and written_dates("这个月") == []
    )
    assert written_dates("13月，2月30日") == []  # outside the calendar: skipped
    assert written_dates("编号12023年") == []  # part of a longer number, not a year
    assert date_words(SAID) == "2023 august 30" and date_words(SAID, day=False) == "2023 august"


def test_a_chinese_count_is_read_from_where_its_run_starts_and_is_at_most_four_long() -> None:
    """A count is matched only from the start of its run of digits or numerals, and only up to 4 of them:
    tried at every position of a long run (a hostile 100,000-digit message), an open-ended count made the
    scan quadratic — minutes of a worker's time. So 12345天前 is no count (not "2345 days ago" either)."""
    assert days("1000天前") == [date(2020, 12, 3)] and days("三十天前") == [date(2023, 7, 31)]
    assert days("12345天前") == [] and not says_when("我等了12345天前后")
    assert days("一二三四五天前") == []
    assert days("1" * 100_000 + "天前") == [] and not says_when("9" * 100_000)


def test_the_week_or_month_before_last_half_a_year_and_the_day_after_tomorrow() -> None:
    """上上周 / 下下周 step two weeks (上上个月 two months), 半年前 is six months and 半个月前 fifteen days
    back, 大后天 three days ahead; half a day points at no other date, and 一年半前 is not read as one year."""
    assert days("上上周我去了杭州") == [date(2023, 8, 16)] and days("下下周五") == [date(2023, 9, 15)]
    assert days("我们上上周一起吃饭") == [date(2023, 8, 16)]  # 一起 is "together", not Monday
    assert days("上上个月") == [date(2023, 6, 28)] and days("大后天见") == [date(2023, 9, 2)]
    assert days("半年前搬的家") == [date(2023, 2, 28)] and days("半个月后") == [date(2023, 9, 14)]
    assert days("半天前") == [] and says_when("半天前") and days("一年半前") == []


def test_dates_written_the_english_way_are_spelt_as_the_index_spells_a_day() -> None:
    assert written_dates("We met on May 2") == ["may 2"] == written_dates("May 2nd was fun")
    assert written_dates("2 May") == ["may 2"] == written_dates("the 2nd of May")
    assert written_dates("in March 2023") == ["2023 march"] == written_dates("March 2023 was cold")
    assert written_dates("May 2nd, 2023") == ["2023 may 2"] and written_dates("Sept. 3") == ["september 3"]
    assert written_dates("since June") == ["june"] and written_dates("mid-March") == ["march"]
    assert says_when("I went to the museum on May 2nd") and says_when("back in March")
    assert written_dates("June 31, and Feb 30") == []  # outside the calendar: skipped


def test_may_and_march_as_words_are_not_dates() -> None:
    """May is also a modal and March a verb: as months they are capitalised and follow no pronoun."""
    for text in ("may I come in?", "March on, soldiers", "I may 2 go", "I May 2 go", "you may 3", "march 5"):
        assert written_dates(text) == [] and not says_when(text), text
    assert written_dates("Mayor 2 votes") == [] and written_dates("at 10:30 May") == []
    for text in ("v1.2 May build", "ratio 3/4 March", "5-2 June"):  # a number's tail is no day
        assert written_dates(text) == [], text
    assert written_dates("March 5") == ["march 5"] and written_dates("in May") == ["may"]
    assert written_dates("June 2") == ["june 2"] == written_dates("june 2")  # other months: any case


def test_a_day_alone_is_a_day_of_the_month_the_turn_was_said_in() -> None:
    assert written_dates("我6号去了博物馆", SAID) == ["2023 august 6"] and says_when("我6号去了博物馆")
    assert written_dates("我6号去了博物馆") == []  # no day said: no month to put it in
    assert written_dates("31号见", datetime(2023, 6, 5, tzinfo=UTC)) == []  # June has no 31st
    assert written_dates("5月6号", SAID) == ["may 6"]  # a month written: the day is that month's
    for text in ("住在3号楼", "坐1号线", "第6号选手", "10日元", "三日游"):  # 号 numbers things too
        assert written_dates(text, SAID) == [] and not says_when(text), text


def test_the_english_date_scan_stays_linear_on_hostile_input() -> None:
    """Every repeat in the English date grammar is bounded, so 100,000 hostile characters scan once
    (an open repeat tried at each position would make them quadratic: minutes of a worker's time)."""
    assert written_dates("May " * 25_000) == [] and not says_when("1 of " * 20_000)
    assert written_dates("May" + " " * 100_000 + "2") == [] and not says_when("in " * 33_000)
    assert len(written_dates("May 2nd, 2023 " * 7_000)) == 7_000
    assert written_dates("1号" * 50_000, SAID) == [
        "2023 august 1"
    ]  # only the last: 号 then a digit is no day
    assert written_dates("2023-1-" * 14_000) == [] and len(written_dates("2023-5-2 " * 11_000)) == 11_000


def test_dates_written_in_digits_year_first_are_spelt_as_the_index_spells_a_day() -> None:
    assert written_dates("我们2023-05-02见过") == ["2023 may 2"] and says_when("我们2023-05-02见过")
    assert written_dates("on 2023/5/2") == ["2023 may 2"] == written_dates("2023.5.2 was a Tuesday")
    assert written_dates("deployed at 2023-12-25T10:00:00Z") == ["2023 december 25"]
    assert written_dates("2023-02-30 and 2023-13-01") == []  # outside the calendar: skipped
    # Not dates: a version, a longer run of numbers, mixed separators, a short form read two ways.
    for text in ("v2023.5.2", "12023-05-02", "2023-05-02-7", "2023.5.2.1", "2023-05/02", "5/2", "3/4 of it"):
        assert written_dates(text) == [], text
