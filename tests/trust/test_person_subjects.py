"""Facts about one named person end each other only when the same attribute of that person changes."""

from __future__ import annotations

import pytest

from .conftest import Lucid

BOTH_CURRENT = [
    ("张三是我们公司的联合创始人", "张三住在北京"),
    ("张三住在北京", "张三是我们公司的联合创始人"),
    ("李雷是我的同事", "李雷就职于腾讯"),
    ("Bob is my colleague", "Bob lives in London"),
    ("my sister Amy lives in Boston", "my sister Amy works at Google"),
    ("张三住在北京", "李四住在上海"),  # two people
]


@pytest.mark.parametrize(("first", "second"), BOTH_CURRENT)
def test_different_attributes_of_a_person_are_both_current(lucid: Lucid, first: str, second: str) -> None:
    assert [lucid.remember(t)["status"] for t in (first, second)] == ["added", "added"]
    assert sorted(lucid.current()) == sorted([first, second])
    assert lucid.history() == []


CHANGED = [
    ("张三住在北京", "张三搬到上海了", "person:张三:所在地"),
    ("张三是我们的CTO", "张三是我们的CEO", "person:张三:职位"),
    ("Bob lives in London", "Bob moved to Paris", "person:Bob:所在地"),
    ("李雷就职于腾讯", "李雷就职于阿里巴巴", "person:李雷:雇主"),
]


@pytest.mark.parametrize(("old", "new", "why"), CHANGED)
def test_the_same_attribute_of_a_person_changing_supersedes(
    lucid: Lucid, old: str, new: str, why: str
) -> None:
    first = lucid.remember(old)
    second = lucid.remember(new)
    assert second["status"] == f"superseded:{why}" and second["superseded"] == [first["id"]]
    assert lucid.current() == [new] and lucid.history() == [old]


def test_a_person_fact_never_ends_the_users_own(lucid: Lucid) -> None:
    lucid.remember("我住在杭州")
    lucid.remember("张三住在北京")
    assert sorted(lucid.current()) == sorted(["我住在杭州", "张三住在北京"])


def test_recall_about_a_person_finds_both_attributes(lucid: Lucid) -> None:
    lucid.remember("张三是我们公司的联合创始人")
    lucid.remember("张三住在北京")
    found = lucid.recall("张三")
    assert "张三是我们公司的联合创始人" in found and "张三住在北京" in found
