"""Forget and purge keep what is still true (found by a review of the forget stop's own changes): a fact the
person's message said beside a reply that used a forgotten one is still learned; a purge cuts a remainder's
words from its old line only, not from whatever else says them; a hand deletion cuts like a forget."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.fakes.ollama import FakeOllama
from tests.trust.test_forget import _redis_dump
from tests.trust.turns import entry_id, memory_file, new_session, ns, raw_text, run_jobs, say
from workers.runtime import Runtime


def _extractor(body: dict) -> str:
    said = json.dumps(body, ensure_ascii=False)
    if "上海" in said:
        return "[事实] 我在上海工作"
    return "好的。"


@pytest.mark.parametrize("forget", [False, True])
def test_a_forget_does_not_drop_an_unrelated_fact_of_the_message_a_reply_answered(
    rt: Runtime, ollama: FakeOllama, forget: bool
) -> None:
    """The person says something new; the reply happens to use an old fact (花生过敏). Forgetting the old
    fact put the person's message among the fact's sources (it was `om_1:reply` → `om_1`), deleted its
    queued extraction and refused it for good: 我在上海工作 (said nowhere else) was never learned. The reply
    is the source now: its words leave the queued extraction, the person's message is still learned."""
    ollama.script("好的，记住了。", "你对花生过敏，在上海吃饭记得避开花生。")
    say(rt, "记住我对花生过敏")
    new_session(rt)
    say(rt, "我在上海工作，晚饭吃什么好")
    rt.writer.flush(ns())  # the reply's record (queued without waiting)
    assert "used=" in raw_text(rt), raw_text(rt) + str(ollama.chat_requests)
    if forget:
        say(rt, f"/forget {entry_id(rt, '花生')[:8]}")
        assert rt.redis is not None
        assert "花生" not in _redis_dump(rt.redis)  # the reply's words left its message's queued extraction
    ollama.responder = _extractor
    run_jobs(rt, "memory")
    assert "上海" in memory_file(rt), memory_file(rt)


@pytest.mark.parametrize("later", [False, True])
def test_purging_a_kept_remainder_does_not_cut_another_persons_words_from_the_archive(
    rt: Runtime, ollama: FakeOllama, cli: Callable[..., tuple[int, str]], later: bool
) -> None:
    """`Forgotten.with_cuts` adds the old line's clause (在阿里巴巴上班, no speaker) as a purge target. The
    purge's "kept" guard only looks at MEMORY/ARCHIVE entries, and the rewrite reaches HEAD (and the disk,
    git-filter-repo resets the work tree): a raw message about someone else that contains the clause is
    cut in the current files too, although the forget itself never marked it."""
    ollama.default_reply = "好的。"
    say(rt, "记住我叫小王，在阿里巴巴上班")
    say(rt, "记住我叫小李")
    say(rt, "我老婆也在阿里巴巴上班，她是产品经理")  # said by the person, about the wife
    rt.writer.flush(ns())
    kept = entry_id(rt, "我在阿里巴巴上班")
    if later:
        say(rt, f"/forget {kept[:8]}")
        assert "我老婆也在阿里巴巴上班" in raw_text(rt)  # the forget leaves it (another fact)
    code, out = cli("forget", kept, "--purge", "--user", "alice", "--tenant", "t1")
    assert code == 0 and "purged" in out, out
    assert "我老婆也在阿里巴巴上班" in raw_text(rt), raw_text(rt)


def test_a_kept_remainder_deleted_by_hand_is_cut_from_its_old_line_too(
    rt: Runtime, ollama: FakeOllama
) -> None:
    """docs/PRIVACY.md: a line deleted by hand counts as a forget, and forgetting a kept remainder cuts
    its words from the superseded line. The hand-deletion path (`_deleted_by_hand`) never goes through
    `Book._forget`, so `_cut_from_predecessors` does not run: 阿里巴巴 stays in the old line."""
    ollama.default_reply = "好的。"
    say(rt, "记住我叫小王，在阿里巴巴上班")
    say(rt, "记住我叫小李")
    path = rt.store.path(ns()) / "MEMORY.md"
    path.write_text(
        "\n".join(ln for ln in path.read_text().splitlines() if "我在阿里巴巴上班" not in ln) + "\n"
    )
    say(rt, "记住我住在余杭区")  # the writer commits the hand edit (a forget) first
    files = memory_file(rt) + "".join(p.read_text() for p in rt.store.path(ns()).glob("ARCHIVE.md"))
    assert "余杭区" in files and "我叫小李" in files
    assert "阿里巴巴" not in files, files


def test_the_cut_old_line_leaves_the_saved_dedup_keys_too(rt: Runtime, ollama: FakeOllama) -> None:
    """After /forget of a kept remainder, no saved derived file may hold its words (PRIVACY: the dedup
    index's saved keys are rewritten in the forget's batch)."""
    ollama.default_reply = "好的。"
    say(rt, "记住我叫小王，在阿里巴巴上班")
    say(rt, "记住我叫小李")
    say(rt, f"/forget {entry_id(rt, '我在阿里巴巴上班')[:8]}")
    assert "阿里巴巴" not in memory_file(rt)
    index = rt.store.path(ns()) / ".index"
    held = [str(p) for p in index.rglob("*") if p.is_file() and "阿里巴巴" in p.read_text(errors="replace")]
    assert not held, held
