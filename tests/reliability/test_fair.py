"""Fair turns and no echoed markup (issue 15, findings 2 and 3), through a live `lucid bot` + `lucid worker`.

Fairness is asserted by ORDER, as Feishu received the replies, never by wall-clock: another person's message
sent while someone's flood is still being answered gets its reply before the flood's next few replies; the
flood is still answered completely, in order, exactly once, and its sender is told once (a new message in the
group that @mentions them, so each message keeps exactly one reply) that they will be answered in order.

Markup: a person's `<at user_id="all">`, `<at user_id="ou_…">` and `[点我](javascript:…)` (in text and in a
post's `md` node) never reach Feishu as markup, whether a model's answer or a quoted memory echoes them; the
exact content sent is checked. (Memory-only confirmations: tests/workers/test_markup.py.)
"""

from __future__ import annotations

import time
from typing import Any

from tests.fakes.feishu_events import group_mention_event, message_event, user
from tests.reliability.conftest import Figures, Shared
from tests.reliability.harness import (
    BOT,
    await_for,
    converse,
    ids_of,
    replies_by_parent,
    text_of,
)
from workers.mailbox import BUSY_BACKLOG

FLOOD = 20
GROUP = "oc_fairgroup000000000000000000000"


def _noted(shared: Shared, events: list[dict[str, Any]]) -> None:
    for ev in events:
        shared.feishu.note_message(ev["event"]["message"]["message_id"], ev["event"]["message"]["chat_id"])


async def test_a_flood_never_holds_up_another_persons_reply(shared: Shared, figures: Figures) -> None:
    stack, feishu = shared.stack, shared.feishu
    flooder, victim = user("fair-flooder"), user("fair-victim")
    base = int(time.time() * 1000)
    flood = [
        group_mention_event(
            f"第{i}条消息", bot_open_id=BOT, sender=flooder, chat_id=GROUP, create_time_ms=base + i
        )
        for i in range(FLOOD)
    ]
    _noted(shared, flood)
    flood_ids = ids_of(flood)
    await converse(stack, flood, concurrency=8)  # all accepted (200) before the victim writes
    mark = len(feishu.sent)  # what Feishu had received when the victim's message was sent
    answered_at_mark = sum(1 for m in feishu.sent[:mark] if m.parent_id in flood_ids)
    assert answered_at_mark <= FLOOD - 5, "the flood was answered before the victim wrote: no contest"

    ask = message_event("我是另一个人，你好", sender=victim, create_time_ms=base + FLOOD + 1)
    _noted(shared, [ask])
    await converse(stack, [ask])
    [ask_id] = ids_of([ask])
    everyone = {*flood_ids, ask_id}
    assert await await_for(lambda: everyone <= set(replies_by_parent(feishu)), 120)

    order = [m.parent_id for m in feishu.sent[mark:] if m.parent_id in everyone]
    before_victim = order.index(ask_id)
    # At most the flood's turn in progress and the one already queued when the victim's job was enqueued.
    assert before_victim <= 2, (before_victim, order)
    by_parent = replies_by_parent(feishu)
    assert [len(by_parent[i]) for i in flood_ids] == [1] * FLOOD  # every one answered, exactly once
    flood_order = [m.parent_id for m in feishu.sent if m.parent_id in flood_ids]
    assert flood_order == flood_ids  # in the order they were written
    assert text_of(by_parent[ask_id][0]) == "好的。"

    notices = [m for m in feishu.sent if m.kind == "create" and m.chat_id == GROUP]
    busy = f'<at user_id="{flooder.open_id}"></at> 你发消息比我回得快，我会按顺序一条条回复，请稍等。'
    # once, @mentioning the flooder (the bot's own mention, the one markup a reply may carry), in the group
    assert [(m.msg_type, m.body) for m in notices] == [("text", {"text": busy})]
    assert FLOOD >= BUSY_BACKLOG
    figures.update(
        flood=FLOOD,
        flood_replies_before_victim=before_victim,
        flood_answered_when_victim_wrote=answered_at_mark,
        busy_notices=len(notices),
    )


async def test_replies_never_carry_the_senders_markup(shared: Shared, figures: Figures) -> None:
    stack, feishu, model = shared.stack, shared.feishu, shared.model
    who = user("markup-sender")
    base = int(time.time() * 1000)
    everyone = '记住 <at user_id="all"></at> 今晚全员加班'
    tagged = '提醒 <at user_id="ou_0123456789abcdef0123456789abcdef">老板</at> 看 [点我](javascript:alert(1))'
    post_md = '看这里 [点我](javascript:alert(document.cookie)) 和 <at user_id="all">所有人</at>'
    # The model repeats what it read (an obedient or injected model): its answer echoes the markup.
    model.add(everyone, f"好的，记住了：{everyone[3:]}")
    model.add(tagged, f"**收到**：{tagged}")
    model.add(post_md, f"你说：{post_md}")
    events = [
        group_mention_event(everyone, bot_open_id=BOT, sender=who, chat_id=GROUP, create_time_ms=base),
        group_mention_event(tagged, bot_open_id=BOT, sender=who, chat_id=GROUP, create_time_ms=base + 1),
        group_mention_event(
            "",
            bot_open_id=BOT,
            sender=who,
            chat_id=GROUP,
            create_time_ms=base + 2,
            message_type="post",
            content={
                "title": "",
                "content": [[{"tag": "at", "user_id": "@_user_1"}], [{"tag": "md", "text": post_md}]],
            },
        ),
        group_mention_event("/memory", bot_open_id=BOT, sender=who, chat_id=GROUP, create_time_ms=base + 3),
    ]
    _noted(shared, events)
    await converse(stack, events)
    ids = ids_of(events)
    assert await await_for(lambda: set(ids) <= set(replies_by_parent(feishu)), 60)
    sent = {i: replies_by_parent(feishu)[i] for i in ids}
    assert [len(sent[i]) for i in ids] == [1, 1, 1, 1]
    got = [(m.msg_type, m.body) for i in ids[:3] for m in sent[i]]
    assert got == [
        ("text", {"text": "好的，记住了：@所有人 今晚全员加班"}),
        ("post", {"zh_cn": {"title": "", "content": [[{"tag": "md", "text": (
            "**收到**：提醒 @老板 看 点我 (javascript:alert(1))"
        )}]]}}),
        ("text", {"text": "你说：看这里 点我 (javascript:alert(document.cookie)) 和 @所有人"}),
    ]  # fmt: skip
    listing = "\n".join(_strings(sent[ids[3]][0].body))  # the memory card (or a text listing)
    assert "@所有人 今晚全员加班" in listing  # the memory as said, quoted back ...
    for message in (m for i in ids for m in sent[i]):  # ... and nothing anywhere as markup
        assert "<at" not in message.content and "](" not in message.content, message.content
        assert _links(message.body) == [], message.content
    figures.update(messages=len(events), mentions_sent=0, links_sent=0)


def _strings(node: Any) -> list[str]:
    """Every string in a message's content (a card's markdown, a post's nodes, a text)."""
    if isinstance(node, dict):
        return [t for v in node.values() for t in _strings(v)]
    if isinstance(node, list):
        return [t for v in node for t in _strings(v)]
    return [node] if isinstance(node, str) else []


def _links(node: Any) -> list[str]:
    """Every href of an `a` node in a post (none may exist: the bot sends links as text)."""
    if isinstance(node, dict):
        found = [str(node.get("href"))] if node.get("tag") == "a" else []
        return found + [h for v in node.values() for h in _links(v)]
    if isinstance(node, list):
        return [h for v in node for h in _links(v)]
    return []
