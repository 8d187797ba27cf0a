"""Deterministic request parsing for the no-model mode: what users type, and what only looks like a request."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_core.entry import TYPES
from memory_core.intents import Intent, classify_type, is_chitchat, is_memorable, parse_intent

REMEMBER = [
    ("记住我对花生过敏", "我对花生过敏"),
    ("请记住我对花生过敏。", "我对花生过敏"),
    ("帮我记住明天下午三点开会", "明天下午三点开会"),
    ("记一下：我的车牌尾号是345", "我的车牌尾号是345"),
    ("记住，我女儿的生日是3月5日", "我女儿的生日是3月5日"),
    ("请帮我记一下我的航班是周五", "我的航班是周五"),
    ("好的，记住我女儿叫朵朵", "我女儿叫朵朵"),
    ("千万别忘了我对青霉素过敏", "我对青霉素过敏"),
    ("别忘了我明天要去医院", "我明天要去医院"),
    ("帮我记下来：周五交报告", "周五交报告"),
    ("记住我喜欢去酒吧", "我喜欢去酒吧"),
    ("我对花生过敏，记住了", "我对花生过敏"),
    ("我下周三生日，记一下", "我下周三生日"),
    ("remember that my wife's birthday is May 3", "my wife's birthday is May 3"),
    ("Remember: I'm allergic to peanuts", "I'm allergic to peanuts"),
    ("Please remember that I'm vegetarian.", "I'm vegetarian"),
    ("please remember I take my coffee black", "I take my coffee black"),
    ("can you remember that I'm vegetarian?", "I'm vegetarian"),
    ("don't forget my flight is on Friday", "my flight is on Friday"),
    ("Don't forget: the office moves in June", "the office moves in June"),
    ("do not forget that I'm left-handed", "I'm left-handed"),
    ("keep in mind I'm colorblind", "I'm colorblind"),
    ("Note that my flight lands at 9pm", "my flight lands at 9pm"),
    ("I'm allergic to shellfish, remember that", "I'm allergic to shellfish"),
    ("remember to call mom on Sunday", "remember to call mom on Sunday"),
]
# Standing instructions are stored whole.
INSTRUCTION = [
    "以后回答都用中文",
    "以后都叫我小王",
    "今后回答请简短一些",
    "从今以后不要用表情",
    "从现在开始叫我老王",
    "请务必用简体中文回复",
    "请每次回答都先给结论",
    "不要再用英文回复了",
    "不要再叫我小王了",
    "from now on, reply in English",
    "Going forward, please keep replies short",
    "In the future, call me Sam",
    "always answer in bullet points",
    "Always call me by my first name",
    "never use emoji",
]
FORGET = [
    ("忘掉我住在余杭区", "我住在余杭区"),
    ("忘记我住在哪", "我住在哪"),
    ("忘了我之前说的公司吧", "我之前说的公司"),
    ("删除记忆：我在余杭区", "我在余杭区"),
    ("请删除关于我工作的记忆", "我工作"),
    ("把我住在余杭区这条删掉", "我住在余杭区"),
    ("把我在余杭区的记忆删了", "我在余杭区"),
    ("别再记着我在阿里工作了", "我在阿里工作"),
    ("删掉这条记忆", ""),
    ("忘掉这个", ""),
    ("forget that I live in Paris", "I live in Paris"),
    ("Please forget that I live in Paris", "I live in Paris"),
    ("forget about my old job", "my old job"),
    ("forget my address", "my address"),
    ("Can you forget my old address?", "my old address"),
    ("forget everything about my ex", "my ex"),
    ("remove the memory that I like coffee", "I like coffee"),
    ("delete the memory about my address", "my address"),
    ("erase my birthday", "my birthday"),
    ("forget that", ""),
    ("delete that", ""),
]
QUESTION = [
    "我在哪",
    "我在哪？",
    "我住哪",
    "我住在哪里？",
    "我叫什么",
    "我叫什么名字",
    "我是谁",
    "我几点开会",
    "你记得我叫什么吗",
    "你还记得我在哪工作吗",
    "你知道我的生日吗",
    "我住在杭州吗",
    "记住了吗？",
    "你能记住我的生日吗？",
    "以后我们会怎么样？",
    "where do I live",
    "where do i work",
    "What's my name?",
    "Who am I?",
    "do you know where I work",
    "Do you remember my name?",
    "Remember when we went to Paris?",
    "Remember me?",
    "tell me my name",
    "what did I say about my job",
    "how old am I",
    "is my birthday in May",
    "我女儿多大了",
    "我们多久没见了？",
]
STATEMENT = [
    "我在余杭区",
    "我现在在西湖区",
    "我在杭州",
    "我在阿里巴巴工作",
    "我忘记密码了",
    "我忘了带钥匙",
    "我总是忘记带钥匙",
    "我今天很开心",
    "I live in Paris",
    "I work at Google",
    "I forgot my keys",
    "I always forget my keys",
    "I'm so tired today",
    "my wife's birthday is May 3",
    "张三是我们的联合创始人",
    "Bob is my cofounder",
    "I'll remember that",
    "I remember that day",
    "我记住了",
    "我来杭州没多久",
    "我学了几年钢琴",
    "其实我对花生过敏",
]
CHITCHAT = [
    "你好",
    "您好",
    "你好呀",
    "嗯",
    "嗯嗯",
    "哈哈",
    "哈哈哈哈哈",
    "好的",
    "好的好的",
    "嗯嗯好的",
    "好的谢谢",
    "谢谢",
    "谢谢你",
    "收到",
    "早上好",
    "晚安",
    "拜拜",
    "在吗？",
    "你好吗",
    "最近怎么样",
    "ok",
    "okay",
    "ok thanks!",
    "okay thanks",
    "thanks",
    "Thanks a lot",
    "thank you",
    "thank you so much!",
    "hi",
    "hello!",
    "hello there",
    "hey there",
    "good morning",
    "how are you",
    "lol",
    "lmao",
    "hahaha",
    "nice",
    "cool",
    "got it",
    "bye",
    "never mind",
    "forget it",
    "Forget about it",
    "6666",
    "👍",
    "😂😂",
    "...",
    "？？",
]
NONE = [
    "以后再说",
    "以后吧",
    "忘了吧",
    "忘记密码了",
    "忘了带伞",
    "忘了告诉你，我搬家了",
    "删除这个文件",
    "把这个文件删掉",
    "delete the file",
    "drop it",
    "记住了",
    "你记住了",
    "always",
    "never again",
    "天气不错",
    "今天好热",
    "帮我写一首诗",
    "Write me a poem",
    "The weather is nice today",
    "123",
    "",
    "   ",
]
PARSE = (
    [(t, "remember", p) for t, p in REMEMBER]
    + [(t, "remember", t) for t in INSTRUCTION]
    + [(t, "forget", p) for t, p in FORGET]
    + [(t, "question", t) for t in QUESTION]
    + [(t, "statement", t) for t in STATEMENT]
    + [(t, "chitchat", t) for t in CHITCHAT]
    + [(t, "none", t.strip()) for t in NONE]
)


@pytest.mark.parametrize(("message", "kind", "text"), PARSE)
def test_parse_intent(message: str, kind: str, text: str) -> None:
    assert parse_intent(message) == Intent(kind, text)  # type: ignore[arg-type]


NOT_CHITCHAT = [
    "我在哪",
    "我住哪",
    "我叫什么",
    "where do I live",
    "what's my name",
    "记住我对花生过敏",
    "好的，记住我女儿叫朵朵",
    "ok so I moved to Berlin",
    "thanks, I live in Paris now",
    "hi, my name is Bob",
    "你好，我叫张三",
    "我在余杭区",
    "帮我写一首诗",
    "123",
    "nook",
    "",
]


@pytest.mark.parametrize("text", CHITCHAT)
def test_fillers_are_chitchat(text: str) -> None:
    assert is_chitchat(text)


@pytest.mark.parametrize("text", NOT_CHITCHAT)
def test_real_messages_are_not_chitchat(text: str) -> None:
    assert not is_chitchat(text)


MEMORABLE = [
    "我是一名后端工程师",
    "我叫张三",
    "my name is Bob",
    "I am a nurse",
    "我喜欢喝美式咖啡",
    "I prefer dark mode",
    "我的技术栈是Python",
    "记住我对花生过敏",
    "remember that I'm vegetarian",
    "以后回答都用中文",
    "我住在杭州",
    "我搬到上海了",
    "我的时区改成东九区了",
    "把默认语言换成英文",
    "我不再喝咖啡了",
    "我现在是产品经理",
    "我对花生过敏",
    "I'm allergic to shellfish",
    "I work at Google",
    "我在阿里巴巴工作",
    "张三是我们的联合创始人",
]
NOT_MEMORABLE = [
    "你好",
    "谢谢",
    "ok thanks",
    "今天天气不错",
    "帮我写一首诗",
    "Write me a poem",
    "这个怎么用",
    "1+1等于几",
    "",
]


@pytest.mark.parametrize("text", MEMORABLE)
def test_durable_facts_are_memorable(text: str) -> None:
    assert is_memorable(text)


@pytest.mark.parametrize("text", NOT_MEMORABLE)
def test_small_talk_is_not_memorable(text: str) -> None:
    assert not is_memorable(text)


CLASSIFY = [
    ("以后回答都用中文", "instruction"),
    ("从现在开始每次都先给结论", "instruction"),
    ("记住要用简体中文", "instruction"),
    ("回复时务必附上来源", "instruction"),
    ("always answer in English", "instruction"),
    ("remember to keep replies short", "instruction"),
    ("用户总是希望先看结论", "instruction"),
    ("我是一名后端工程师", "identity"),
    ("我叫张三", "identity"),
    ("用户的职业是医生", "identity"),
    ("I am a developer", "identity"),
    ("I'm an engineer at heart", "identity"),
    ("my name is Bob", "identity"),
    ("我喜欢喝美式咖啡", "preference"),
    ("我讨厌香菜", "preference"),
    ("用户偏好深色主题", "preference"),
    ("I prefer dark mode", "preference"),
    ("my favorite color is green", "preference"),
    ("我更喜欢中文", "preference"),
    ("我住在杭州", "fact"),
    ("I am based in Berlin", "fact"),
    ("我在阿里巴巴工作", "fact"),
    ("I'm so tired today", "fact"),
    ("用户对花生过敏", "fact"),
    ("张三是我们的联合创始人", "fact"),
    ("the project deadline is June 3", "fact"),
]


@pytest.mark.parametrize(("text", "type_"), CLASSIFY)
def test_classify_type(text: str, type_: str) -> None:
    assert classify_type(text) == type_


def test_enough_cases() -> None:
    total = len(PARSE) + len(NOT_CHITCHAT) + len(MEMORABLE) + len(NOT_MEMORABLE) + len(CLASSIFY)
    assert total >= 120


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.lists(st.sampled_from([t for t, *_ in PARSE] + ["？", "，", "记住", "forget ", "以后", " "])).map(
            "".join
        ),
    )
)
def test_everything_is_total(message: str) -> None:
    intent = parse_intent(message)
    assert intent.kind in ("remember", "forget", "question", "statement", "chitchat", "none")
    assert intent.text == intent.text.strip()
    if intent.kind in ("remember", "forget"):
        assert intent.text in message or intent.text == message.strip()
    assert isinstance(is_chitchat(message), bool)
    assert isinstance(is_memorable(message), bool)
    assert classify_type(message) in TYPES
