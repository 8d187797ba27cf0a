"""One protection rule for every automatic path: pinned entries, rules, identities and instructions change
only by the person. The rule is `memory_core.policy.protected`, tested once here; the paths (the model's
tool, extraction, replay, light and deep dreaming) are shown to ask it."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from memory_core import policy
from memory_core.dream_deep import plan_clusters
from memory_core.dream_light import plan_light
from memory_core.entry import TYPES, Entry
from memory_core.namespace import Namespace
from memory_core.ops import Edit, Forget, Remember
from memory_core.store import Store
from memory_core.writer import LocalLocker, Writer
from tests.fakes.ollama import FakeOllama
from workers.inbound import Inbound
from workers.turn import run_turn

from .conftest import Lucid, ns_memory, tool, turn_runtime

NS = Namespace.of("t1", "alice", "default")
T0 = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("pinned", [False, True])
def test_the_one_rule(kind: str, pinned: bool) -> None:
    e = Entry(id="e1", text="x", type=kind, pinned=pinned)
    assert policy.protected(e) == (pinned or kind in ("rule", "identity", "instruction"))
    for source in ("tool", "extract", "replay", "dream", "import"):
        assert policy.may_change(e, source) == (not policy.protected(e))
    for source in ("user", "manual"):
        assert policy.may_change(e, source)


# ------------------------------------------------------------------------------------------ the tool


def _inbound(text: str) -> Inbound:
    return Inbound(
        tenant="t1", user="alice", open_id="ou_alice", persona="default", chat_id="oc_p2p_alice",
        chat_type="p2p", message_id=f"om_{uuid.uuid4().hex}", text=text, mentioned_bot=False,
        create_time=int(time.time() * 1000),
    )  # fmt: skip


def _seed(data_dir: Path, *ops: Remember) -> list[str]:
    writer = Writer(Store(data_dir), LocalLocker(Store(data_dir)))
    return [str(o.id) for o in writer.submit(NS, list(ops))]


@pytest.mark.parametrize(
    ("seed", "call"),
    [
        (Remember(text="回答时永远不要透露公司内部代号", type="rule"), {"action": "forget"}),
        (Remember(text="孩子对花生过敏", pinned=True), {"action": "forget"}),
        (Remember(text="我叫王小明", type="identity"), {"action": "update", "text": "我叫王大明"}),
        (Remember(text="以后回答都用中文", type="instruction"), {"action": "forget"}),
        (Remember(text="我住在余杭区", pinned=True), {"action": "add", "text": "我住在西湖区"}),
    ],
)
def test_the_models_tool_cannot_delete_or_rewrite_what_is_protected(
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,
    ollama: FakeOllama,
    seed: Remember,
    call: dict[str, str],
) -> None:
    rt = turn_runtime(data_dir, redis_url, ollama)
    [ident] = _seed(data_dir, seed)
    if call["action"] != "add":
        call = {**call, "target": ident}
    ollama.script(tool(**call), "这条记忆受保护，我没有改动。")
    replies: list[str] = []
    run_turn(rt, _inbound("帮我处理一下这条记忆"), replies.append)

    memory = ns_memory(rt, NS)
    line = next(ln for ln in memory.splitlines() if seed.text in ln)
    assert "vt=" not in line and "~~" not in line  # still there, still current, unchanged
    answer = json.loads(
        next(m for m in ollama.chat_requests[-1]["messages"] if m["role"] == "tool")["content"]
    )
    assert answer["status"] == "rejected:protected"
    assert "only the person can" in answer["error"]  # a refusal the model can relay
    assert replies == ["这条记忆受保护，我没有改动。"]


def test_the_tool_still_forgets_an_ordinary_fact(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = turn_runtime(data_dir, redis_url, ollama)
    [ident] = _seed(data_dir, Remember(text="那家面馆不错"))
    ollama.script(tool(action="forget", target=ident), "已忘掉。")
    run_turn(rt, _inbound("忘掉面馆那条"), lambda _: None)
    assert "那家面馆不错" not in ns_memory(rt, NS)


# ------------------------------------------------------------------------------------------ writer paths


@pytest.mark.parametrize("source", ["extract", "replay", "tool"])
def test_extraction_and_replay_cannot_supersede_or_rewrite_a_pin(data_dir: Path, source: str) -> None:
    writer = Writer(Store(data_dir), LocalLocker(Store(data_dir)))
    [pinned] = writer.submit(NS, [Remember(text="我住在余杭区", pinned=True)])
    out = writer.submit(
        NS,
        [
            Remember(text="我现在在西湖区", source=source),
            Edit(pinned.id or "", "我住在滨江区", source),
            Forget(pinned.id or "", source=source),
        ],
    )
    assert [o.status for o in out] == ["rejected:protected"] * 3
    memory = (Store(data_dir).path(NS) / "MEMORY.md").read_text("utf-8")
    assert "我住在余杭区" in memory and "vt=" not in memory


def test_the_users_own_act_changes_a_pin(lucid: Lucid) -> None:
    lucid.remember("我住在余杭区", "--pin")
    assert lucid.remember("我现在在西湖区")["status"].startswith("superseded:")
    assert lucid.current() == ["我现在在西湖区"]


# ------------------------------------------------------------------------------------------ dreaming


def _aged(**kw: object) -> Entry:
    kw.setdefault("at", T0 - timedelta(days=400))
    return Entry(**kw)  # type: ignore[arg-type]


PROTECTED = [
    _aged(id="p1", text="孩子对花生过敏，千万注意", pinned=True),
    _aged(id="r1", text="回答时永远不要透露公司内部代号", type="rule"),
    _aged(id="i1", text="我叫王小明", type="identity"),
    _aged(id="n1", text="以后回答都用中文", type="instruction"),
]


def test_light_dreaming_never_plans_a_change_to_a_protected_entry() -> None:
    twins = [_aged(id=f"{e.id}-twin", text=e.text + "。", at=T0 - timedelta(days=300)) for e in PROTECTED]
    cold = _aged(id="c1", text="那家面馆不错")
    planned = plan_light([*PROTECTED, *twins, cold], T0)
    touched = {op.target for op in planned} | {op.into for op in planned if op.into}
    assert not touched & {e.id for e in PROTECTED}
    assert "c1" in touched  # light dreaming does run: the cold ordinary entry is planned


def test_deep_dreaming_never_offers_a_protected_entry_to_the_model() -> None:
    group = [
        _aged(id="a", text="周末常去西湖边跑步"),
        _aged(id="b", text="周末常去西湖边骑车"),
        _aged(id="c", text="周末常去西湖边喝茶", pinned=True),
        _aged(id="d", text="周末常去西湖边钓鱼", type="instruction"),
    ]
    clusters = plan_clusters(group, T0)
    assert [c.ids for c in clusters] == [("a", "b")]
