"""Replies never carry markup a sender typed (`workers.markup`), checked as the class it is — every form of
Feishu mention and Markdown link — and end to end on the memory-only path (no model: the confirmation and
the quoted memory echo the sender's words) against the fake Feishu, by the exact content it received."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from memory_core.namespace import Namespace
from tests.fakes.feishu import FakeFeishu
from workers.inbound import Inbound
from workers.markup import neutralize
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings
from workers.turn import feishu_turn

BOT = "ou_markup_bot_000000000000000000000"
GROUP = "oc_markup_group_00000000000000000000"

CASES = [
    ('<at user_id="all"></at> 今晚全员加班', "@所有人 今晚全员加班"),
    ("<at user_id='all'/>开会", "@所有人开会"),
    ('<AT user_id="all">', "@所有人"),
    ('找 <at user_id="ou_0123456789abcdef">老板</at> 签字', "找 @老板 签字"),
    ('<at open_id="ou_abc"></at>', "@ou_abc"),
    ("<at>x</at>", "@x"),
    ("[点我](javascript:alert(1))", "点我 (javascript:alert(1))"),
    ("![图](https://evil.example/x.png)", "图 (https://evil.example/x.png)"),
    ('[点我](javascript:void(0) "title")', "点我 (javascript:void(0))"),
    ("[[嵌套](javascript:a)](javascript:b)", "嵌套 (javascript:a) (javascript:b)"),
    ("[点我](<javascript:alert(1)>)", "点我 (javascript:alert(1))"),
    ("<javascript:alert(1)>", "javascript:alert(1)"),
    ("[x][1]\n[1]: javascript:alert(1)", "[x][1]\n1: javascript:alert(1)"),
    ('<a href="javascript:alert(1)">点我</a>', "点我"),
    ('<font color="red">红</font><b>粗</b>', "红粗"),
    ("`[代码](javascript:x)`", "`代码 (javascript:x)`"),
]
BENIGN = [
    "我喜欢喝美式咖啡",
    "**加粗** 和 `代码`\n- 列表\n1. 第一",
    "a < b and c > d, 3<4",
    "数组 arr[0] 和 (括号)",
    "邮箱 a@b.com @张三",
    "```python\nprint('hi')\n```",
]


@pytest.mark.parametrize(("said", "sent"), CASES)
def test_every_mention_tag_and_link_form_becomes_plain_text(said: str, sent: str) -> None:
    assert neutralize(said) == sent
    assert neutralize(sent) == sent  # once is enough; nothing more changes


@pytest.mark.parametrize("said", BENIGN)
def test_plain_text_and_the_bots_own_markdown_are_left_alone(said: str) -> None:
    assert neutralize(said) == said


@pytest.fixture
def feishu() -> Iterator[FakeFeishu]:
    with FakeFeishu(bot_open_id=BOT) as fake:
        yield fake


@pytest.fixture
def rt(tmp_path: Path, redis_url: str, feishu: FakeFeishu) -> Runtime:
    persona = Persona("x", app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret="secret", bot_open_id=BOT)
    settings = Settings(data_dir=tmp_path / "data", feishu_domain=feishu.url, personas={"x": persona})
    return build(settings, redis_url, git=False)


def group_message(text: str, feishu: FakeFeishu) -> Inbound:
    item = Inbound(
        tenant="t-markup", user="on_markup", open_id="ou_markup_sender", persona="x", chat_id=GROUP,
        chat_type="group", message_id=f"om_{uuid.uuid4().hex}", text=text, mentioned_bot=True,
        create_time=int(time.time() * 1000),
    )  # fmt: skip
    feishu.note_message(item.message_id, GROUP)
    return item


def sent_to(feishu: FakeFeishu, item: Inbound) -> list[tuple[str, object]]:
    return [(m.msg_type, m.body) for m in feishu.sent if m.parent_id == item.message_id]


def test_memory_only_confirmation_and_quoted_memory_carry_no_mention_or_link(
    rt: Runtime, feishu: FakeFeishu, redis_client: object
) -> None:
    words = '<at user_id="all"></at> 今晚全员加班 [详情](javascript:alert(1))'
    said = turn(rt, feishu, "记住 " + words)
    listing = turn(rt, feishu, "/memory")

    assert said == [("text", {"text": "好的，我记住了：@所有人 今晚全员加班 详情 (javascript:alert(1))"})]
    [(kind, card)] = listing  # the memory card: each entry a markdown element
    assert kind == "interactive"
    shown = [t for t in _strings(card) if "今晚全员加班" in t]
    assert shown == ["@所有人 今晚全员加班 详情 \\(javascript:alert\\(1\\)\\)"], shown
    memory = (Namespace.of("t-markup", "on_markup", "x").path(rt.store.data_dir) / "MEMORY.md").read_text()
    assert words in memory  # kept exactly as said: it is data; only what is sent is neutralised


def _strings(node: object) -> list[str]:
    if isinstance(node, dict):
        return [t for v in node.values() for t in _strings(v)]
    if isinstance(node, list):
        return [t for v in node for t in _strings(v)]
    return [node] if isinstance(node, str) else []


def turn(rt: Runtime, feishu: FakeFeishu, text: str) -> list[tuple[str, object]]:
    item = group_message(text, feishu)
    feishu_turn(rt, item)
    return sent_to(feishu, item)
