"""Routing: which verified events become a turn, and what an ignored one says in the log and the metrics.

`route` is pure (no clock of its own), so the stale window is checked at its exact edge with an injected
`now_ms`. The reasons are pinned verbatim: they are the `outcome=ignored: …` of the log line and the
`reason` label of `lucid_events_ignored_total`, what an operator reads to learn why a message got no answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from bot.routing import MAX_CREATE_TIME_MS, Ignored, route
from tests.fakes.feishu_events import (
    ALICE,
    BOB,
    GROUP_CHAT_ID,
    TENANT_KEY,
    group_mention_event,
    message_event,
)
from workers.inbound import Inbound, Mention

BOT = "ou_bot_routing_000000000000000000"
NOW = 1_764_000_000_000  # an epoch-ms "now" the events are measured against
STALE = 30 * 60 * 1000
MID = "om_routing_message_1"


def _route(event: dict[str, Any], bot: str = BOT) -> Inbound | Ignored:
    return route(event, "enc", bot, now_ms=NOW, stale_ms=STALE)


def _event(text: str = "你好", **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("create_time_ms", NOW - 1000)
    return message_event(text, message_id=MID, **kwargs)


def _with(change: Callable[[dict[str, Any]], object], base: dict[str, Any] | None = None) -> dict[str, Any]:
    event = base if base is not None else _event()
    change(event)
    return event


def _msg(event: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = event["event"]["message"]
    return message


def _sender(event: dict[str, Any]) -> dict[str, Any]:
    sender: dict[str, Any] = event["event"]["sender"]
    return sender


_BOT_MENTION = {"key": "@_user_1", "name": "Lucid", "id": {"open_id": BOT}}
LONG_TYPE = "im.chat.member.bot.added_v1." + "x" * 100

IGNORED: dict[str, tuple[Callable[[], dict[str, Any]], Ignored]] = {
    "v1 schema with a header": (
        lambda: _with(lambda e: e.update(schema="1.0")),
        Ignored("not a v2.0 event"),
    ),
    "v2 schema without a header": (
        lambda: _with(lambda e: e.update(header="h")),
        Ignored("not a v2.0 event"),
    ),
    "another event type, its name cut to 64 characters": (
        lambda: _with(lambda e: e["header"].update(event_type=LONG_TYPE)),
        Ignored("unsupported event type " + LONG_TYPE[:64]),
    ),
    "message not an object": (
        lambda: _with(lambda e: e["event"].update(message="m")),
        Ignored("malformed message event"),
    ),
    "sender not an object": (
        lambda: _with(lambda e: e["event"].update(sender=["s"])),
        Ignored("malformed message event"),
    ),
    "message id that could escape a Redis key": (
        lambda: _with(lambda e: _msg(e).update(message_id="../../om_x")),
        Ignored("malformed message id"),
    ),
    "sent by an app": (
        lambda: _with(lambda e: _sender(e).update(sender_type="app")),
        Ignored("not sent by a person", MID),
    ),
    "no open_id": (
        lambda: _with(lambda e: _sender(e)["sender_id"].pop("open_id")),
        Ignored("malformed sender or chat", MID),
    ),
    "no chat_id": (
        lambda: _with(lambda e: _msg(e).pop("chat_id")),
        Ignored("malformed sender or chat", MID),
    ),
    "create_time not a number": (
        lambda: _with(lambda e: _msg(e).update(create_time="yesterday")),
        Ignored("malformed create_time", MID),
    ),
    "create_time of 5,000 digits": (
        lambda: _with(lambda e: _msg(e).update(create_time="9" * 5000)),
        Ignored("malformed create_time", MID),
    ),
    "create_time of infinity (a JSON 1e999)": (
        lambda: _with(lambda e: _msg(e).update(create_time=float("inf"))),
        Ignored("malformed create_time", MID),
    ),
    "create_time before 1970": (
        lambda: _with(lambda e: _msg(e).update(create_time="-5")),
        Ignored("malformed create_time", MID),
    ),
    "create_time in the year 2286": (
        lambda: _with(lambda e: _msg(e).update(create_time=str(MAX_CREATE_TIME_MS))),
        Ignored("malformed create_time", MID),
    ),
    "one millisecond past the stale window": (
        lambda: _event(create_time_ms=NOW - STALE - 1),
        Ignored("stale", MID),
    ),
    "stale by the header's time when the message has none": (
        lambda: _with(
            lambda e: (_msg(e).pop("create_time"), e["header"].update(create_time=str(NOW - 2 * STALE)))
        ),
        Ignored("stale", MID),
    ),
    "stale by the message's time, whatever the header says": (
        lambda: _with(
            lambda e: e["header"].update(create_time=str(NOW)), _event(create_time_ms=NOW - 2 * STALE)
        ),
        Ignored("stale", MID),
    ),
    "a group message before the bot knows who it is": (
        lambda: group_mention_event("在吗", bot_open_id=BOT, message_id=MID, create_time_ms=NOW),
        Ignored("bot identity not known yet", MID, retry=True),
    ),
    "a group message without an @mention": (
        lambda: _event("大家好", chat_type="group"),
        Ignored("group message without an @mention of the bot", MID),
    ),
    "a text of blanks": (lambda: _event("  \n "), Ignored("empty text", MID)),
    "a text of the bot's own mention only": (
        lambda: _with(lambda e: _msg(e).update(mentions=[_BOT_MENTION]), _event("@_user_1")),
        Ignored("empty text", MID),
    ),
}


@pytest.mark.parametrize("case", list(IGNORED))
def test_an_ignored_event_says_why_and_which_message(case: str) -> None:
    make, expected = IGNORED[case]
    bot = "" if case == "a group message before the bot knows who it is" else BOT
    assert _route(make(), bot) == expected


def test_a_message_is_answered_up_to_the_last_millisecond_of_the_stale_window() -> None:
    inbound = _route(_event(create_time_ms=NOW - STALE))
    assert isinstance(inbound, Inbound) and inbound.create_time == NOW - STALE


def test_a_message_without_any_create_time_is_answered_and_never_counted_stale() -> None:
    event = _with(lambda e: (_msg(e).pop("create_time"), e["header"].pop("create_time")))
    inbound = _route(event)
    assert isinstance(inbound, Inbound) and inbound.create_time == 0 and inbound.text == "你好"


def test_a_one_to_one_message_works_before_the_bot_knows_its_identity() -> None:
    inbound = _route(_event("在吗"), bot="")
    assert isinstance(inbound, Inbound) and inbound.text == "在吗" and inbound.chat_type == "p2p"


def test_a_routed_message_carries_every_field_the_turn_needs() -> None:
    event = group_mention_event(
        "问问 @_user_2", bot_open_id=BOT, sender=ALICE, mentions=[BOB], message_id=MID,
        create_time_ms=NOW - 5, thread_id="omt_thread_1", event_id="ev_1",
    )  # fmt: skip
    assert _route(event) == Inbound(
        tenant=TENANT_KEY,
        user=ALICE.union_id,
        open_id=ALICE.open_id,
        persona="enc",
        chat_id=GROUP_CHAT_ID,
        chat_type="group",
        message_id=MID,
        text="问问 @Bob",
        mentioned_bot=True,
        create_time=NOW - 5,
        event_id="ev_1",
        mentions=(Mention(name="Bob", open_id=BOB.open_id, union_id=BOB.union_id),),
        kind="text",
        thread_id="omt_thread_1",
    )


def test_the_tenant_is_the_headers_else_the_senders_else_default() -> None:
    both = _with(
        lambda e: (e["header"].update(tenant_key="t_header"), _sender(e).update(tenant_key="t_sender"))
    )
    sender_only = _with(lambda e: (e["header"].pop("tenant_key"), _sender(e).update(tenant_key="t_sender")))
    neither = _with(lambda e: (e["header"].pop("tenant_key"), _sender(e).pop("tenant_key")))
    tenants = [r.tenant if isinstance(r, Inbound) else r for r in map(_route, (both, sender_only, neither))]
    assert tenants == ["t_header", "t_sender", "default"]


def test_a_rich_text_is_read_and_an_image_only_one_becomes_a_typed_placeholder() -> None:
    post = {"zh_cn": {"title": "", "content": [[{"tag": "text", "text": "看这个"}]]}}
    images = {
        "zh_cn": {
            "title": "",
            "content": [[{"tag": "img", "image_key": "img_v3_1"}], [{"tag": "text", "text": " "}]],
        }
    }
    photo = {"image_key": "img_v3_2"}
    routed = [
        _route(_event(message_type=mt, content=c))
        for mt, c in (("post", post), ("post", images), ("image", photo))
    ]
    assert [(r.kind, r.text) if isinstance(r, Inbound) else r for r in routed] == [
        ("text", "看这个"),
        ("image", "[image]"),
        ("image", "[image image_key=img_v3_2]"),
    ]


def test_a_text_message_keeps_its_text_and_kind() -> None:
    inbound = _route(_event(" 我住在 余杭区 "))
    assert isinstance(inbound, Inbound) and (inbound.kind, inbound.text) == ("text", "我住在 余杭区")
