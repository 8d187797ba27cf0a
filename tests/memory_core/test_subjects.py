"""The deterministic subject recogniser: what users actually type, and the look-alikes that must not match."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_core.entry import TYPES
from memory_core.policy import CANONICAL, canonical_subject
from memory_core.profile import about_someone_else
from memory_core.subjects import Recognised, recognise

LOCATION = [
    ("我在余杭区", "余杭区"),
    ("我现在在西湖区", "西湖区"),
    ("我住在杭州", "杭州"),
    ("我现在住在上海浦东", "上海浦东"),
    ("我住在杭州市西湖区", "杭州市西湖区"),
    ("我搬到深圳了", "深圳"),
    ("我已经搬到上海了", "上海"),
    ("我搬家到成都", "成都"),
    ("我搬去广州了", "广州"),
    ("我搬到杭州工作了", "杭州"),
    ("我人在北京", "北京"),
    ("我现在人在上海", "上海"),
    ("我在美国", "美国"),
    ("我在纽约", "纽约"),
    ("我在杭州工作", "杭州"),
    ("我在西湖区上班", "西湖区"),
    ("对了，我搬到杭州了", "杭州"),
    ("我住在北京好多年了", "北京"),
    ("我在兰州三年了", "兰州"),
    ("我坐标杭州", "杭州"),
    ("我的城市是苏州", "苏州"),
    ("我的地址是文三路100号", "文三路100号"),
    ("我目前定居在大理", "大理"),
    ("对 我在杭州", "杭州"),
    ("嗯嗯 我搬到上海了", "上海"),
    ("I live in Paris", "Paris"),
    ("i live in paris", "paris"),
    ("I'm in London", "London"),
    ("I’m in London", "London"),
    ("I am based in Berlin", "Berlin"),
    ("I moved to New York last year", "New York"),
    ("I'm now living in Tokyo", "Tokyo"),
    ("I relocated to Singapore", "Singapore"),
    ("I've been living in Berlin since 2019", "Berlin"),
    ("btw I live in Paris with my wife", "Paris"),
    ("so I moved to Denver", "Denver"),
    ("I'm based out of Austin, Texas", "Austin"),
    ("I live in the Bay Area", "the Bay Area"),
    ("im in seattle", "seattle"),
    ("my address is 221B Baker Street", "221B Baker Street"),
]
EMPLOYER = [
    ("我在阿里巴巴工作", "阿里巴巴"),
    ("我现在在阿里工作了", "阿里"),
    ("我在腾讯上班", "腾讯"),
    ("我在腾讯当产品经理", "腾讯"),
    ("我就职于字节跳动", "字节跳动"),
    ("我入职了腾讯", "腾讯"),
    ("我加入了字节跳动", "字节跳动"),
    ("我跳槽到了美团", "美团"),
    ("我的公司是阿里巴巴", "阿里巴巴"),
    ("我是腾讯的员工", "腾讯"),
    ("I work at Google", "Google"),
    ("I work for Microsoft", "Microsoft"),
    ("I'm working at Meta now", "Meta"),
    ("I joined Stripe as an engineer", "Stripe"),
    ("I got a job at Amazon", "Amazon"),
    ("my employer is Acme Corp", "Acme Corp"),
    ("my company is Shopify", "Shopify"),
    ("I'm a software engineer at Google", "Google"),
]
NAME = [
    ("我叫张三", "张三"),
    ("我的名字是李四", "李四"),
    ("我名字叫王小明", "王小明"),
    ("叫我老王就行", "老王"),
    ("你可以叫我小张", "小张"),
    ("以后叫我Tom", "Tom"),
    ("你好，我是张三", "张三"),
    ("my name is Bob", "Bob"),
    ("my name's Jane Doe", "Jane Doe"),
    ("call me Alice", "Alice"),
    ("you can call me Ishmael", "Ishmael"),
    ("I go by Liz", "Liz"),
    ("Hi, I'm Bob", "Bob"),
    ("Hello, I am Sarah, nice to meet you", "Sarah"),
]
TIMEZONE = [
    ("我在东八区", "东八区"),
    ("我的时区是UTC+8", "UTC+8"),
    ("我用北京时间", "北京时间"),
    ("我这边是UTC+8", "UTC+8"),
    ("我在太平洋时区", "太平洋时区"),
    ("my time zone is PST", "PST"),
    ("my timezone is Asia/Shanghai", "Asia/Shanghai"),
    ("I'm on PST", "PST"),
    ("I'm in UTC+8", "UTC+8"),
    ("I am in CET", "CET"),
    ("I'm on Eastern time", "Eastern time"),
]
LANGUAGE = [
    ("请用中文回复", "中文"),
    ("以后用英文和我说话", "英文"),
    ("我更喜欢中文", "中文"),
    ("以后请用中文回答我", "中文"),
    ("说中文吧", "中文"),
    ("我的偏好语言是中文", "中文"),
    ("可以用英文回复吗？", "英文"),
    ("please answer in English", "English"),
    ("I prefer English", "English"),
    ("Can you reply in French?", "French"),
    ("please reply to me in Chinese from now on", "Chinese"),
    ("from now on, answer in English", "English"),
    ("let's talk in Japanese", "Japanese"),
    ("I'd like you to answer in Spanish", "Spanish"),
    ("I prefer to speak in German", "German"),
]
TECH_STACK = [
    ("我的技术栈是Python和Go", "Python和Go"),
    ("我主要用Rust开发", "Rust"),
    ("我一般用Java开发", "Java"),
    ("我平时写Python", "Python"),
    ("我是写Go的", "Go"),
    ("我的编程语言是Python", "Python"),
    ("my stack is TypeScript and React", "TypeScript and React"),
    ("my tech stack is Django + Postgres", "Django + Postgres"),
    ("I mainly code in Python", "Python"),
    ("I program in Rust", "Rust"),
]
HOMETOWN = [
    ("我是杭州人", "杭州"),
    ("我老家是湖南", "湖南"),
    ("我来自四川", "四川"),
    ("I'm from Shanghai", "Shanghai"),
    ("I'm originally from Brazil", "Brazil"),
    ("I grew up in Ohio", "Ohio"),
]
THIRD_PARTY = [
    ("张三是我们的联合创始人", "person:张三", "我们的联合创始人"),
    ("我同事小李住在上海", "person:小李", "住在上海"),
    ("我的同事叫小李", "person:小李", "我的同事"),
    ("我老婆小红是医生", "person:小红", "是医生"),
    ("张三住在北京", "person:张三", "住在北京"),
    ("my colleague Bob lives in Paris", "person:Bob", "lives in Paris"),
    ("my wife Anna is a doctor", "person:Anna", "is a doctor"),
    ("Bob is my cofounder", "person:Bob", "my cofounder"),
    ("my wife's name is Anna", "person:Anna", "my wife"),
    ("Alice works at Google", "person:Alice", "works at Google"),
    ("Bob lives in Berlin", "person:Bob", "lives in Berlin"),
    ("对象小红住在北京", "person:小红", "住在北京"),
    ("同事小李在腾讯工作", "person:小李", "在腾讯工作"),
]
POSITIVE = (
    [(t, "所在地", v, "fact") for t, v in LOCATION]
    + [(t, "雇主", v, "fact") for t, v in EMPLOYER]
    + [(t, "姓名", v, "identity") for t, v in NAME]
    + [(t, "时区", v, "fact") for t, v in TIMEZONE]
    + [(t, "语言", v, "preference") for t, v in LANGUAGE]
    + [(t, "技术栈", v, "fact") for t, v in TECH_STACK]
    + [(t, "家乡", v, "fact") for t, v in HOMETOWN]
    + [(t, s, v, "fact") for t, s, v in THIRD_PARTY]
)

NOT_AN_ATTRIBUTE = [
    # activities and momentary states are not where someone is
    "我在开会",
    "我在吃饭",
    "我在想",
    "我在想去哪个区",
    "我在写一个小镇的故事",
    "我在家",
    "我在公司",
    "我在路上",
    "我在医院",
    "我在学校上课",
    "我在北京出差",
    "我在北京读书",
    "我住院了",
    "我在家工作",
    "I'm in a meeting",
    "I'm in love",
    "I am in Trouble",
    "I'm living in a small town",
    "I live at home",
    "I work at night",
    "I work at home",
    "I work for myself",
    "I'm tired",
    "I'm Chinese",
    "Hi, I'm Chinese",
    "Hi, I'm new here",
    "I code in my free time",
    # questions set nothing
    "我住哪",
    "我在哪？",
    "我住在哪里",
    "我叫什么",
    "Where do I live?",
    "where do I work",
    "Can you speak French?",
    # negation, past, future, hypotheticals
    "我不住在北京了",
    "我以前住在北京",
    "我之前在阿里工作",
    "我要搬到上海",
    "我下个月搬到上海",
    "如果我住在北京",
    "I don't live in Paris anymore",
    "I used to live in Paris",
    "I'm moving to Paris next month",
    "I want to live in Paris",
    "If I lived in Paris",
    # errands and look-alikes
    "我叫了外卖",
    "我叫车",
    "我叫他过来",
    "请叫我起床",
    "call me later",
    "call me back",
    "my name is not important",
    "我是程序员",
    "我是学生",
    "你好，我是新来的",
    "我平时用微信",
    "我喜欢英文歌",
    "I like French",
    "I prefer tea",
    "我加入了一个读书会",
    "我加入了健身房",
    "I joined a gym",
    "I'm a big fan of Google",
    "我公司是做电商的",
    "I'm from the future",
    "今天天气不错",
    "",
    "   ",
]
# A third party's fact must never be filed under the user: either nothing, or a person: subject.
ABOUT_SOMEONE_ELSE = [
    "他住在北京",
    "我朋友住在上海",
    "我老婆在上海工作",
    "我和老婆住在上海",
    "小王在腾讯工作",
    "周末在家工作",
    "He lives in Paris",
    "He works at Google",
    "They moved to Paris",
    "my friend told me he lives in Paris",
    "This is my friend",
    "我同事小李住在上海",
    "my colleague Bob lives in Paris",
    "张三是我们的联合创始人",
    "我老板叫王总",
    "老婆孩子都住在北京",
    "老师住在北京",
    "大家住在北京",
    "小明和小红住在北京",
]


@pytest.mark.parametrize(("text", "subject", "value", "type_"), POSITIVE)
def test_recognises_what_the_user_states(text: str, subject: str, value: str, type_: str) -> None:
    assert recognise(text) == Recognised(subject, value, type_)


@pytest.mark.parametrize("text", NOT_AN_ATTRIBUTE)
def test_look_alikes_set_no_attribute(text: str) -> None:
    assert recognise(text) is None


@pytest.mark.parametrize("text", ABOUT_SOMEONE_ELSE)
def test_third_party_facts_are_never_the_users(text: str) -> None:
    found = recognise(text)
    assert found is None or found.subject.startswith("person:")


@pytest.mark.parametrize("text", ["用户住在杭州西湖区", "用户在阿里巴巴工作", "用户的名字叫小王"])
def test_the_user_named_as_the_user_is_not_a_third_party(text: str) -> None:
    """用户… is how extraction and profiles name the person (as `meaning.with_speaker` reads it): such a
    line must not be filed as a person called 用户 (a profile of 用户住在… was refused as third-party)."""
    found = recognise(text)
    assert found is None or not found.subject.startswith("person:")
    assert about_someone_else(text) is None


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("我在余杭区", "我现在在西湖区"),
        ("我住在北京", "我搬到上海了"),
        ("I live in Paris", "I moved to Berlin"),
        ("我在阿里巴巴工作", "我入职了腾讯"),
        ("I work at Google", "I joined Stripe"),
        ("请用中文回复", "please answer in English"),
        ("我叫张三", "叫我老王就行"),
        ("我在东八区", "my time zone is PST"),
    ],
)
def test_a_changed_attribute_keeps_its_subject_so_it_can_supersede(before: str, after: str) -> None:
    old, new = recognise(before), recognise(after)
    assert old is not None and new is not None
    assert old.subject == new.subject
    assert old.value != new.value


ALIASES = [
    ("location", "所在地"),
    ("Location", "所在地"),
    ("residence", "所在地"),
    ("city", "所在地"),
    ("居住地", "所在地"),
    ("住址", "所在地"),
    ("所在城市", "所在地"),
    ("lives_in", "所在地"),
    ("LIVES-IN", "所在地"),
    ("所在地", "所在地"),
    ("employer", "雇主"),
    ("Company", "雇主"),
    ("公司", "雇主"),
    ("单位", "雇主"),
    ("工作单位", "雇主"),
    ("name", "姓名"),
    ("名字", "姓名"),
    ("姓名", "姓名"),
    ("timezone", "时区"),
    ("time zone", "时区"),
    ("Time_Zone", "时区"),
    ("ＴＩＭＥＺＯＮＥ", "时区"),
    ("时区", "时区"),
    ("language", "语言"),
    ("preferred language", "语言"),
    ("语言", "语言"),
    ("偏好语言", "语言"),
    ("tech stack", "技术栈"),
    ("stack", "技术栈"),
    ("技术栈", "技术栈"),
    ("  hometown ", "家乡"),
    ("person:张三", "person:张三"),
    ("person: 张三 ", "person:张三"),
    ("人物：张三", "person:张三"),
    ("Person:Bob", "person:Bob"),
    ("Favourite  Food", "favourite food"),
    ("ＦＯＯ", "foo"),
    ("宠物", "宠物"),
]


@pytest.mark.parametrize(("alias", "canonical"), ALIASES)
def test_canonical_subject_maps_aliases(alias: str, canonical: str) -> None:
    assert canonical_subject(alias) == canonical


@pytest.mark.parametrize("key", CANONICAL)
def test_canonical_keys_are_fixed_points(key: str) -> None:
    assert canonical_subject(key) == key


def test_enough_cases() -> None:
    total = len(POSITIVE) + len(NOT_AN_ATTRIBUTE) + len(ABOUT_SOMEONE_ELSE) + len(ALIASES)
    assert total >= 120


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_canonical_subject_is_idempotent(subject: str) -> None:
    once = canonical_subject(subject)
    assert canonical_subject(once) == once


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.lists(st.sampled_from([t for t, *_ in POSITIVE] + NOT_AN_ATTRIBUTE + [" ", "，", "?", "了"])).map(
            "".join
        ),
    )
)
def test_recognise_is_total_and_returns_canonical_subjects(text: str) -> None:
    found = recognise(text)
    if found is not None:
        assert found.value.strip() == found.value and found.value
        assert found.subject in CANONICAL or found.subject.startswith("person:")
        assert canonical_subject(found.subject) == found.subject
        assert found.type in TYPES
        assert found.value in " ".join(unicodedata.normalize("NFKC", text).replace("’", "'").split())
