"""Only a same-meaning rewording updates in place (one current line, same id, nothing in history) — also
below the 0.65 bigram threshold; and statements that merely look alike stay two current facts."""

from __future__ import annotations

import pytest

from memory_core.similarity import DUPLICATE, jaccard

from .conftest import Lucid

REWORDINGS = [
    ("我每天早上都跑步", "用户每天早上跑步"),  # the speaker said two ways, a filler dropped
    ("每天早上我都跑步", "我每天早上跑步"),  # the same words in another order
    ("我非常喜欢爬山", "用户喜欢爬山"),
    ("我很喜爱深色主题", "我喜欢深色主题"),
    ("I like hiking", "I really enjoy hiking"),
    ("The user likes green tea", "I like green tea"),
    ("I currently live with two cats", "I live with two cats"),
    ("我住在杭州", "我住在杭州西湖区"),  # more detail, same fact
    ("我有两个孩子", "我有两个孩子，都在上小学"),
]


@pytest.mark.parametrize(("old", "new"), REWORDINGS)
def test_a_rewording_updates_in_place(lucid: Lucid, old: str, new: str) -> None:
    first = lucid.remember(old)
    second = lucid.remember(new)
    assert second["status"] == "updated" and second["id"] == first["id"]
    assert lucid.current() == [new]
    assert lucid.history() == []  # a rewording is not a change: nothing to keep as history


def test_the_rule_reaches_below_the_bigram_threshold() -> None:
    """The pairs above include ones plain bigram Jaccard calls different: the judge, not the score, decides."""
    below = [(a, b) for a, b in REWORDINGS if jaccard(a, b) < DUPLICATE]
    assert len(below) >= 4


def test_a_shorter_saying_of_a_stored_fact_changes_nothing(lucid: Lucid) -> None:
    first = lucid.remember("我有两个孩子，都在上小学")
    again = lucid.remember("我有两个孩子")
    assert again["status"] == "unchanged" and again["id"] == first["id"]
    assert lucid.current() == ["我有两个孩子，都在上小学"]


DIFFERENT = [
    ("我喜欢喝茶", "我喜欢喝咖啡"),  # likes accumulate
    ("我去过北京", "我去过上海"),  # so do places visited
    ("I visited Tokyo", "I visited Osaka"),
    ("我的第0个愿望是去0号星球", "我的第20个愿望是去20号星球"),  # ordinals name two things
    ("张三是我们公司的联合创始人", "李四是我们公司的联合创始人"),  # two people
    ("我喜欢猫", "我对花生过敏"),
]


@pytest.mark.parametrize(("one", "other"), DIFFERENT)
def test_statements_that_only_look_alike_are_both_kept(lucid: Lucid, one: str, other: str) -> None:
    assert [lucid.remember(t)["status"] for t in (one, other)] == ["added", "added"]
    assert sorted(lucid.current()) == sorted([one, other])
    assert lucid.history() == []


def test_a_rewording_keeps_the_pin_and_hits(lucid: Lucid) -> None:
    first = lucid.remember("我非常喜欢爬山", "--pin")
    lucid.remember("用户喜欢爬山")
    row = lucid.entry("用户喜欢爬山")
    assert row["id"] == first["id"] and row["pinned"] is True
