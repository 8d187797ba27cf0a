"""The memory service a turn uses: active recall, its breaker, hit feedback, the frozen resident tier and
embeddings through the real `ollama` client against a fake Ollama over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from memory_core.lineformat import RawMessage, parse_file
from memory_core.namespace import Namespace
from memory_core.ops import Forget, Remember
from tests.fakes.ollama import FakeOllama
from workers.memory_service import ACTIVE_RECALL_SNIPPETS, SNIPPET_CHARS, MemoryService, SnippetRule
from workers.runtime import build
from workers.settings import Settings

NS = Namespace.of("t1", "alice", "default")
NOW = datetime(2026, 6, 26, 12, 0, tzinfo=UTC)


def _service(
    data_dir: Path, redis_url: str | None = None, snippets: SnippetRule | None = None, **settings: Any
) -> MemoryService:
    rt = build(
        Settings(data_dir=data_dir, now=NOW, config_path=data_dir / "none.toml", **settings),
        redis_url=redis_url,
    )
    return MemoryService(rt, snippets=snippets)


def _say(
    svc: MemoryService, ident: str, text: str, session: str, chat: str = "oc_alice", days_ago: int = 0
) -> None:
    ts = NOW - timedelta(days=days_ago)
    out = svc.record(NS, RawMessage(id=ident, ts=ts, speaker="alice", text=text, chat=chat, session=session))
    assert out.status == "recorded"


def test_active_recall_finds_old_sessions_not_the_current_one(data_dir: Path) -> None:
    svc = _service(data_dir)
    _say(svc, "m1", "上次去京都玩的时候住在岚山附近的民宿", "s-old", days_ago=40)
    _say(svc, "m2", "京都的红叶季节是十一月中旬", "s-old", days_ago=40)
    _say(svc, "m3", "京都还有什么好玩的地方", "s-now")
    snippets = svc.active_recall(NS, "京都还有什么好玩的地方", session="s-now", chat="oc_alice")
    ids = [s.message_id for s in snippets]
    assert ids and set(ids) <= {"m1", "m2"} and len(ids) <= 3
    block = svc.assemble(
        NS, "京都还有什么好玩的地方", chat_type="p2p", chat="oc_alice", session="s-now", now=NOW
    ).block
    assert "岚山" in block and "Earlier conversation" in block
    group = svc.assemble(NS, "京都还有什么好玩的地方", chat_type="group", chat="oc_g", session="s-g", now=NOW)
    assert group.snippets == [] and "岚山" not in group.block  # never in a group


def test_active_recall_shows_a_reply_found_through_the_question_it_answers(data_dir: Path) -> None:
    svc = _service(data_dir)
    _say(svc, "q1", "你周末画了什么？", "s-old", days_ago=9)
    _say(svc, "a1", "一幅湖上的日出，送给了奶奶", "s-old", days_ago=9)
    # o1 shares one character (画) with the request, and nothing next to it shares more
    _say(svc, "o1", "我一直喜欢画画", "s-other", days_ago=5)
    got = [s.message_id for s in svc.active_recall(NS, "我周末画了什么", session="s-now", chat="oc_alice")]
    assert "a1" in got  # the answer, though it shares no word with the request
    assert "o1" not in got


def test_a_line_a_recalled_fact_was_learned_from_gives_its_place_to_another(data_dir: Path) -> None:
    """The block's lines of past conversation add what its facts do not already say: the line a recalled
    fact was learned from is not shown again beside it, and the next line found takes its place."""
    svc = _service(data_dir, snippets=SnippetRule(count=1))
    _say(svc, "k1", "我在京都住过岚山附近的民宿", "s-old", days_ago=30)
    _say(svc, "k2", "京都的岚山竹林早上人少", "s-old", days_ago=20)
    first = svc.assemble(NS, "京都的民宿怎么样", chat_type="p2p", chat="oc_alice", session="s1", now=NOW)
    assert [s.message_id for s in first.snippets] == ["k1"]  # the best line, while no fact holds it
    learned = Remember(text="住过京都岚山附近的民宿", source="extraction", origin="k1")
    assert svc.apply(NS, [learned])[0].ok
    got = svc.assemble(NS, "京都的民宿怎么样", chat_type="p2p", chat="oc_alice", session="s2", now=NOW)
    assert [s.entry.origin for s in got.recalled] == ["k1"]
    assert [s.message_id for s in got.snippets] == ["k2"]
    assert "岚山竹林" in got.block and "我在京都住过岚山" not in got.block


def test_a_line_whose_fact_the_token_budget_left_out_is_still_shown(data_dir: Path) -> None:
    """The skip above holds only for facts the block really shows: a recalled fact the token budget cut
    leaves its line of conversation free to be shown."""
    svc = _service(data_dir, snippets=SnippetRule(count=1))
    _say(svc, "k1", "我在京都住过岚山附近的民宿，老板叫田中，一晚八千日元", "s-old", days_ago=30)
    _say(svc, "k2", "京都的岚山竹林早上人少", "s-old", days_ago=20)
    notes = "京都的民宿攻略笔记：" + "，".join(
        f"第{i}家民宿在京都的祇园附近价格适中早餐不错" for i in range(42)
    )
    fact = "住过京都岚山附近的民宿，老板叫田中，一晚八千日元（" + "细节" * 60 + "）"
    ops = [
        Remember(text=notes),
        Remember(text=notes.replace("笔记", "记录")),
        Remember(text=fact, origin="k1"),
    ]
    assert [o.status for o in svc.apply(NS, ops)] == ["added"] * 3
    got = svc.assemble(NS, "京都的民宿怎么样", chat_type="p2p", chat="oc_alice", session="s1", now=NOW)
    assert "k1" in [s.entry.origin for s in got.recalled] and "细节细节" not in got.block  # recalled, cut
    assert [s.message_id for s in got.snippets] == ["k1"] and "老板叫田中" in got.block


def test_active_recall_in_a_private_chat_never_shows_a_groups_lines(data_dir: Path) -> None:
    """What the person heard or said in a group (others' words among it) stays in that group: a private
    turn's earlier-conversation lines come from one-to-one chats only, as the model's session_search does."""
    svc = _service(data_dir)
    group = RawMessage(
        id="g1", ts=NOW - timedelta(days=3), speaker="bob", text="鲍勃说他对京都的寺庙很熟，下次带大家去",
        chat="oc_team", chat_type="group", session="s-g",
    )  # fmt: skip
    assert svc.record(NS, group).status == "recorded"
    _say(svc, "p1", "我下个月想去京都看寺庙", "s-old", days_ago=2)
    got = [s.message_id for s in svc.active_recall(NS, "京都的寺庙谁熟悉", session="s-now", chat="oc_alice")]
    assert got == ["p1"]
    block = svc.assemble(NS, "京都的寺庙谁熟悉", chat_type="p2p", chat="oc_alice", session="s-now", now=NOW)
    assert "鲍勃" not in block.block


def _earlier_lines(block: str) -> list[str]:
    return block.split("## Earlier conversation\n", 1)[1].split("\n</memory-context>")[0].splitlines()


def test_a_reply_reaches_the_block_with_the_question_it_answers(data_dir: Path) -> None:
    svc = _service(data_dir)
    _say(svc, "q1", "你周末画了什么？", "s-old", days_ago=9)
    _say(svc, "a1", "一幅湖上的日出，送给了奶奶", "s-old", days_ago=9)
    got = svc.assemble(NS, "我周末画了什么", chat_type="p2p", chat="oc_alice", session="s-now", now=NOW)
    # one line, in the order they were said: the model reads the answer with its question
    assert "- [2026-06-17] 你周末画了什么？ → 一幅湖上的日出，送给了奶奶" in got.block.splitlines()
    assert got.block.count("你周末画了什么") == 1  # the question found on its own is not shown twice


def test_a_pair_keeps_the_order_of_the_conversation(data_dir: Path) -> None:
    svc = _service(data_dir)
    _say(svc, "a1", "一幅湖上的日出，送给了奶奶", "s-old", days_ago=9)  # the first turn of its session
    _say(svc, "n1", "这就是我周末画的画", "s-old", days_ago=9)
    _say(svc, "x1", "晚饭吃面条", "s-old", days_ago=9)
    block = svc.assemble(
        NS, "我周末画了什么", chat_type="p2p", chat="oc_alice", session="s-now", now=NOW
    ).block
    assert "一幅湖上的日出，送给了奶奶 → 这就是我周末画的画" in block


def test_a_question_shown_in_a_pair_is_not_shown_again(data_dir: Path) -> None:
    svc = _service(data_dir)
    ts = NOW - timedelta(days=9)
    turns = [
        ("Melanie", "What did you paint last weekend?"),
        ("Caroline", "A sunrise over the lake, for my grandma!"),  # named in the request: found first
        ("Melanie", "Lovely, she will adore it."),
    ]
    for i, (speaker, text) in enumerate(turns):
        svc.record(
            NS, RawMessage(id=f"m{i}", ts=ts, speaker=speaker, text=text, chat="oc_alice", session="s-old")
        )
    q = "What did Caroline paint last weekend?"
    lines = _earlier_lines(svc.assemble(NS, q, chat_type="p2p", chat="oc_alice", session="s", now=NOW).block)
    assert [line for line in lines if "What did you paint" in line] == [
        "- [2026-06-17] What did you paint last weekend? → A sunrise over the lake, for my grandma!"
    ]


def test_a_pair_stays_within_one_snippet_of_characters(data_dir: Path) -> None:
    svc = _service(data_dir)
    _say(svc, "q1", "你周末画了什么？" + "我想知道细节，" * 30, "s-old", days_ago=9)
    _say(svc, "a1", "一幅湖上的日出，送给了奶奶", "s-old", days_ago=9)
    snippets = svc.active_recall(NS, "我周末画了什么", session="s-now", chat="oc_alice")
    pair = next(s for s in snippets if s.message_id == "a1")
    assert pair.text.startswith("你周末画了什么？") and pair.text.endswith("→ 一幅湖上的日出，送给了奶奶")
    assert len(pair.text) <= SNIPPET_CHARS + 1  # + the ellipsis


def test_a_turn_shows_at_most_its_snippet_count_or_its_character_budget(data_dir: Path) -> None:
    lines = [f"京都第{i}天去了一座寺庙，叫做第{i}号寺" for i in range(8)]
    for i, text in enumerate(lines):
        _say(_service(data_dir), f"m{i}", text, f"s-old{i}", days_ago=40 - i)
    shown = _earlier_lines(
        _service(data_dir)
        .assemble(NS, "京都寺庙", chat_type="p2p", chat="oc_alice", session="s", now=NOW)
        .block
    )
    assert len(shown) == ACTIVE_RECALL_SNIPPETS
    budget = len(lines[0]) * 2 + 1  # room for two of these lines, not three
    svc = _service(data_dir, snippets=SnippetRule(count=8, chars=budget))
    assert (
        len(
            _earlier_lines(
                svc.assemble(NS, "京都寺庙", chat_type="p2p", chat="oc_alice", session="t", now=NOW).block
            )
        )
        == 2
    )


def test_active_recall_breaker_skips_for_a_minute_after_three_failures(data_dir: Path) -> None:
    svc = _service(
        data_dir,
    )
    _say(svc, "m1", "上次去京都玩的时候住在岚山附近的民宿", "s-old", days_ago=40)
    svc.active_budget = 0.0  # every search now counts as too slow
    for _ in range(3):
        assert svc.active_recall(NS, "京都民宿", session="s-now", chat="oc_alice") == []
    svc.active_budget = 10.0
    assert svc.active_recall(NS, "京都民宿", session="s-now", chat="oc_alice") == []  # breaker open
    assert svc.search(NS, "京都民宿")  # the archive itself is fine


def test_hit_feedback_lands_with_the_next_write(
    data_dir: Path, redis_client: redis.Redis, redis_url: str
) -> None:
    svc = _service(data_dir, redis_url)
    svc.apply(NS, [Remember(text="孩子对花生过敏", source="user")])
    got = svc.assemble(NS, "孩子能吃花生酱吗", chat_type="p2p", chat="oc_alice", session="s1", now=NOW)
    ids = [s.entry.id for s in got.recalled]
    assert ids
    svc.feedback(NS, ids, NOW)
    _say(svc, "m9", "好的谢谢", "s1")  # the reply's record carries the queued feedback into the same batch
    entry = next(iter(parse_file((data_dir / "t1/alice/default/MEMORY.md").read_text("utf-8")).entries()))
    assert entry.hits == 1 and entry.last == NOW


def test_resident_tier_is_frozen_for_the_session_but_forget_is_immediate(data_dir: Path) -> None:
    svc = _service(data_dir)
    a = svc.apply(NS, [Remember(text="回答要简洁", type="instruction")])[0]
    first = svc.assemble(NS, "你好", chat_type="p2p", chat="oc_alice", session="s1", now=NOW)
    assert [e.text for e in first.resident] == ["回答要简洁"]
    svc.apply(NS, [Remember(text="我喜欢用中文交流", type="preference")])
    same = svc.assemble(NS, "你好", chat_type="p2p", chat="oc_alice", session="s1", now=NOW)
    assert [e.text for e in same.resident] == ["回答要简洁"]  # the prompt prefix stays stable
    fresh = svc.assemble(NS, "你好", chat_type="p2p", chat="oc_alice", session="s2", now=NOW)
    assert {e.text for e in fresh.resident} == {"回答要简洁", "我喜欢用中文交流"}
    svc.apply(NS, [Forget(id=a.id or "")])
    after = svc.assemble(NS, "你好", chat_type="p2p", chat="oc_alice", session="s1", now=NOW)
    assert after.resident == []


def test_embeddings_through_ollama_and_fallback_when_it_is_down(data_dir: Path) -> None:
    with FakeOllama(models=["embedder"]) as fake:
        svc = _service(data_dir, ollama_host=fake.url, embed_model="embedder")
        svc.apply(NS, [Remember(text="我喜欢喝咖啡"), Remember(text="周末常去爬山")])
        svc.wait_for_embeddings()  # entries are embedded off the turn, after the write
        with_vectors = svc.recall(NS, "我很喜欢喝咖啡吗", NOW)
        assert with_vectors[0].entry.text == "我喜欢喝咖啡"
        assert fake.embed_requests  # the real client called the fake's /api/embed
        fake.down()
        calls = len(fake.embed_requests)
        for _ in range(4):
            lexical = svc.recall(NS, "喝咖啡", NOW)
            assert [s.entry.text for s in lexical] == ["我喜欢喝咖啡"]  # lexical fallback, never an error
        fake.up()
        svc.recall(NS, "喝咖啡", NOW)
        assert len(fake.embed_requests) == calls  # breaker open: no call for a minute


def test_a_record_without_waiting_is_applied_by_the_flush_job(
    data_dir: Path, redis_client: redis.Redis, redis_url: str
) -> None:
    from workers.worker import Worker

    svc = _service(data_dir, redis_url)
    msg = RawMessage(
        id="om_reply", ts=NOW, speaker="Lucid", text="好的，记住了", chat="oc_alice", session="s1"
    )
    assert svc.record(NS, msg, wait=False) is None
    assert not (data_dir / "t1/alice/default/raw").exists()  # queued, not yet written
    Worker(svc.runtime, ("memory",)).work(burst=True)
    assert [h.id for h in svc.search(NS, "记住了")] == ["om_reply"]
