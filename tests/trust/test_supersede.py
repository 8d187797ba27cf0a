"""A change of meaning supersedes: the old line gets `vt` and stays as history, the new one is current with
`sup`, and the outcome says why — whether or not the attribute is one the subject recogniser knows."""

from __future__ import annotations

import pytest

from .conftest import Lucid

# (old, new, why): every pair is a change a person would expect to replace what was remembered.
CHANGES = [
    # negation and modality flips
    ("用户喜欢在周末加班写代码", "用户不喜欢在周末加班写代码", "negation"),
    ("我还在健身", "我不再健身了", "negation"),
    ("我会开车", "我不会开车", "negation"),
    ("我吃香菜", "我不吃香菜了", "negation"),
    ("我有一辆车", "我没有车了", "negation"),
    ("I drink coffee every morning", "I don't drink coffee anymore", "negation"),
    ("I eat meat", "I no longer eat meat", "negation"),
    ("I smoke", "I stopped smoking", "negation"),
    ("I can swim", "I can't swim", "negation"),
    # a number changed in the same statement
    ("周三下午3点开会", "周三下午4点开会", "number"),
    ("我有两个孩子", "我有三个孩子", "number"),
    ("I run 5 km every day", "I run 10 km every day", "number"),
    # possessive slots: 我的X是 / 换成 / 改成, my X is / now / changed to
    ("我的老板是王总", "我的老板是李总", "slot:老板"),
    ("我的手机是iPhone", "我把手机换成了华为", "slot:手机"),
    ("我的车是特斯拉", "我的车换成了比亚迪", "slot:车"),
    ("我最喜欢的城市是北京", "我最喜欢的城市是上海", "slot:最喜欢的城市"),
    ("my boss is Alice", "my boss is now Bob", "slot:boss"),
    ("my phone is an iPhone", "I changed my phone to a Pixel", "slot:phone"),
    ("my favourite band is Muse", "my favourite band is Coldplay", "slot:favourite band"),
    # another place or organisation in the same statement
    ("项目部署在 AWS 东京区域", "项目部署在 AWS 大阪区域", "place"),
    ("我在字节跳动工作", "我在腾讯工作", "name"),
    # attributes the recogniser knows
    ("我在余杭区", "我现在在西湖区", "subject:所在地"),
    ("I live in Paris", "I moved to Berlin", "subject:所在地"),
    ("I work at Google", "I joined Stripe", "subject:雇主"),
]


@pytest.mark.parametrize(("old", "new", "why"), CHANGES)
def test_a_change_supersedes_and_the_old_value_stays_as_history(
    lucid: Lucid, old: str, new: str, why: str
) -> None:
    first = lucid.remember(old)
    second = lucid.remember(new)

    assert second["status"] == f"superseded:{why}"
    assert second["superseded"] == [first["id"]]
    assert lucid.current() == [new]  # what is current: only the new value
    assert lucid.history() == [old]  # what history holds: the old value, never lost
    assert "vt=" in lucid.line_of(old) and f"sup={first['id']}" in lucid.line_of(new)


def test_recall_serves_the_new_value_not_both(lucid: Lucid) -> None:
    lucid.remember("我的老板是王总")
    lucid.remember("我的老板是李总")
    found = lucid.recall("我的老板是谁")
    assert "我的老板是李总" in found and "我的老板是王总" not in found


def test_a_second_change_supersedes_the_current_value_only(lucid: Lucid) -> None:
    a, b, c = "我的老板是王总", "我的老板是李总", "我的老板是赵总"
    lucid.remember(a)
    second = lucid.remember(b)
    third = lucid.remember(c)
    assert third["superseded"] == [second["id"]]
    assert lucid.current() == [c]
    assert sorted(lucid.history()) == sorted([a, b])


def test_a_superseded_value_survives_light_dreaming_in_the_archive(lucid: Lucid) -> None:
    lucid.remember("我还在健身")
    lucid.remember("我不再健身了")
    lucid.run("dream", "--phase", "light")
    assert lucid.current() == ["我不再健身了"]
    assert "我还在健身" in lucid.archive_md() and "我还在健身" not in lucid.memory_md()


# A chat model's subject (here given with --subject, as the model's tool or extraction would) is used,
# and the deterministic rules still guard it.
def test_a_model_subject_supersedes_a_changed_value(lucid: Lucid) -> None:
    lucid.remember("我是素食者", "--subject", "饮食")
    out = lucid.remember("我不再吃素了", "--subject", "饮食")
    assert out["status"] == "superseded:subject:饮食"
    assert lucid.current() == ["我不再吃素了"] and lucid.history() == ["我是素食者"]


def test_a_model_subject_does_not_end_an_unrelated_fact(lucid: Lucid) -> None:
    lucid.remember("我喜欢吃辣", "--subject", "饮食")
    assert lucid.remember("我对花生过敏", "--subject", "饮食")["status"] == "added"
    assert sorted(lucid.current()) == sorted(["我喜欢吃辣", "我对花生过敏"])


def test_a_wrong_model_subject_cannot_end_where_i_live(lucid: Lucid) -> None:
    lucid.remember("我住在杭州")
    assert lucid.remember("我喜欢北京的秋天", "--subject", "所在地")["status"] == "added"
    assert sorted(lucid.current()) == sorted(["我住在杭州", "我喜欢北京的秋天"])


def test_a_model_subject_over_a_rewording_updates_in_place(lucid: Lucid) -> None:
    first = lucid.remember("我每天早上都跑步", "--subject", "运动")
    out = lucid.remember("用户每天早上跑步", "--subject", "运动")
    assert out["status"] == "updated" and out["id"] == first["id"]
