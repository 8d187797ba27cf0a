"""Secrets: the corpus of tests/memory_core/secret_corpus.py (271 secrets in Chinese and English messages,
147 benign look-alikes) through every write path, then a search of everything Lucid persisted.

Paths, each in its own namespace: the message itself (raw archive), the chat model's `manage_memory` tool
call adding it, background extraction returning it as a fact, replay returning it as a fact, a deep-dream
merge that slips it in, a profile that slips it in, and a hand edit of MEMORY.md followed by a write.

Persisted = every file under the data directory, which (as with `lucid serve`'s embedded default) also holds
Redis and its AOF; every git object of every namespace (`git cat-file --batch-all-objects`, the reflog and
`git log -p --all`); the logs of the bot and worker processes and the log records of the in-process runs.
A secret shorter than 8 characters (PINs, CVVs) is searched with the words before it ("CVV: 318"), longer
ones alone; each in plain, JSON-escaped and line-format-escaped form. Benign look-alikes must be stored as
they were said. Counts per path are the figures.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memory_core.intents import parse_intent
from memory_core.lineformat import LineError, escape, format_time, parse_entry
from memory_core.namespace import Namespace
from memory_core.ops import Put, Remember
from memory_core.similarity import normalise
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import TENANT_KEY, message_event, user
from tests.fakes.ollama import FakeOllama
from tests.memory_core.secret_corpus import BENIGN, POSITIVES, Positive
from tests.reliability.conftest import Figures
from tests.reliability.harness import (
    EXTRACT_PREFIX,
    Stack,
    await_for,
    clean_env,
    converse,
    env_int,
    files_text,
    git,
    git_everything,
    ids_of,
    last_user_text,
    lucid_import,
    memory_entries,
    raw_messages,
    replies_by_parent,
)

MODEL = "qwen3:4b"
PATHS = ("message", "tool call", "extraction", "replay", "dream merge", "profile", "hand edit")


def needles(p: Positive) -> set[str]:
    start = p.text.find(p.secret)
    core = p.secret if len(p.secret) >= 8 or start < 0 else p.text[max(0, start - 6) : start + len(p.secret)]
    forms = {core, json.dumps(core)[1:-1], json.dumps(core, ensure_ascii=False)[1:-1], escape(core)}
    return {f for f in forms if f.strip()}


class SecretModel:
    """The model of every path: it hands back whatever secret (or look-alike) the test puts in its mouth."""

    def __init__(self) -> None:
        self.tool: dict[str, str] = {}  # message → text to add with manage_memory
        self.extract: dict[str, str] = {}  # message marker → fact returned by extraction / replay
        self.current = ""  # what the next deep merge or profile slips in

    def __call__(self, body: dict[str, Any]) -> Any:
        messages = body.get("messages") or []
        system = str(messages[0].get("content") or "")
        last = last_user_text(body)
        if system.startswith(EXTRACT_PREFIX):
            found = [fact for key, fact in self.extract.items() if key in last]
            return "\n".join(f"[user] {' '.join(f.split())}" for f in found) or "NONE"
        if '"merges"' in system:
            memories = json.loads(last)["memories"]
            text = "；".join(m["text"] for m in memories) + "；" + " ".join(self.current.split())
            return json.dumps(
                {"merges": [{"ids": [m["id"] for m in memories], "text": text}]}, ensure_ascii=False
            )
        if "profile of ONE person" in system:
            lines = [ln.split(") ", 1)[-1] for ln in last.splitlines() if ln.startswith("- (")]
            return "\n".join([*lines, " ".join(self.current.split())])
        if last in self.tool and not any(m.get("role") == "tool" for m in messages):
            return {
                "content": "",
                "tool_calls": [
                    {
                        "function": {
                            "name": "manage_memory",
                            "arguments": {"action": "add", "text": self.tool[last]},
                        }
                    }
                ],
            }
        return "好的。"


def persisted(data: Path, logs: dict[str, str]) -> dict[str, str]:
    """Everything persisted, as text by place: each file under `data` (Redis's AOF included), every git
    object and patch of each namespace, each log."""
    out: dict[str, str] = {}
    for path, text in files_text(data):
        out[str(path.relative_to(data))] = text
    for git_dir in data.rglob(".git"):
        out[f"{git_dir.parent.relative_to(data)}/.git (every object)"] = git_everything(git_dir.parent)
    out.update(logs)
    return out


def find_secrets(places: dict[str, str], positives: list[Positive]) -> list[tuple[str, str, str]]:
    found = []
    for p in positives:
        for needle in needles(p):
            for where, text in places.items():
                if needle in text:
                    found.append((p.id, needle, where))
    return found


def sample(items: list[Any], every: int) -> list[Any]:
    return items[::every] if every > 1 else list(items)


def secrets_run(tmp_path: Path, feishu: FakeFeishu, figures: Figures, every: int) -> None:
    from workers import embedded_redis
    from workers.dreaming import run_phase
    from workers.runtime import build
    from workers.settings import Settings

    positives = sample(POSITIVES, every)
    benign = [text for _, text in sample(BENIGN, every)]
    cases = [p.text for p in positives] + benign
    data = tmp_path / "data"
    data.mkdir()
    server = embedded_redis.start(data, persist=True)  # where `lucid serve` keeps it: <data>/.redis, AOF on
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(f"{record.getMessage()} {record.exc_text or ''}")  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.DEBUG)
    model = SecretModel()
    leaks: dict[str, list[tuple[str, str, str]]] = {}
    stored: Counter[str] = Counter()
    people = {path: user(f"secrets-{path.replace(' ', '-')}") for path in PATHS}
    ns = {path: Namespace.of(TENANT_KEY, who.union_id, "x") for path, who in people.items()}
    # the paths through the bot spread their messages over several people: one person's turns are answered
    # one at a time (in order), several people's in parallel by the two workers
    senders = {path: [user(f"secrets-{path.replace(' ', '-')}-{k}") for k in range(6)] for path in PATHS[:3]}

    def ever_stored(path: str) -> set[str]:
        """Every entry text MEMORY.md of the path's people ever held (git history included): a benign text
        that a later near-duplicate updated in place was stored, and history keeps it."""
        texts: set[str] = set()
        for who in senders[path]:
            root = Namespace.of(TENANT_KEY, who.union_id, "x").path(data)
            if not (root / ".git").exists():
                continue
            for line in git(root, "log", "-p", "--format=", "--", "MEMORY.md").splitlines():
                if line[:1] in "+-" and line[1:].startswith("- "):
                    with contextlib.suppress(LineError):
                        texts.add(parse_entry(line[1:]).text)
        return texts

    def kept(benign: list[str], texts: set[str], said: str = "") -> int:
        """Benign texts stored as said, or within a stored text once punctuation is set aside (the upsert
        keeps the fuller of two texts; "记住…:" is stored without its colon). With `said` (the message's
        prefix), a benign text that is a question, not something to remember, counts when the raw archive
        kept it unredacted (the bot answered it; there was nothing to store)."""
        norms = [normalise(t) for t in texts]
        count = 0
        for b in benign:
            if said and parse_intent(said + b).kind != "remember":
                count += 1  # checked unredacted in the raw archive (the "message (raw, unredacted)" figure)
            elif any(normalise(b) in n for n in norms):
                count += 1
        return count

    def entries_of(path: str) -> list[Any]:
        return [
            e
            for who in senders[path]
            for e in memory_entries(Namespace.of(TENANT_KEY, who.union_id, "x").path(data))[0]
        ]

    try:
        with FakeOllama(responder=model) as ollama:
            stack = Stack(
                tmp_path, server.url, feishu, bots=1, workers=2, ollama_url=ollama.url, chat_model=MODEL
            )
            assert stack.data == data  # the stack's processes share this data dir (and its embedded Redis)
            with stack:
                base = int(time.time() * 1000)

                async def send(path: str, texts: list[str]) -> list[str]:
                    events = []
                    for n, text in enumerate(texts):
                        ev = message_event(
                            text,
                            sender=senders[path][n % len(senders[path])],
                            create_time_ms=base + len(events) + 100_000 * PATHS.index(path),
                        )
                        feishu.note_message(
                            ev["event"]["message"]["message_id"], ev["event"]["message"]["chat_id"]
                        )
                        events.append(ev)
                    await converse(stack, events, concurrency=8)
                    ids = ids_of(events)
                    assert await await_for(
                        lambda: all(i in replies_by_parent(feishu) for i in ids), timeout=300
                    )
                    stack.settle(120)
                    return ids

                import asyncio

                loop = asyncio.new_event_loop()
                try:
                    # 1. the message itself: raw archive redacted; benign "记住…" stored as said
                    loop.run_until_complete(
                        send("message", [p.text for p in positives] + [f"记住{b}" for b in benign])
                    )
                    texts = {e.text for e in entries_of("message")}
                    raw = {
                        m.text
                        for who in senders["message"]
                        for m in raw_messages(Namespace.of(TENANT_KEY, who.union_id, "x").path(data))
                    }
                    stored["message"] = kept(benign, texts | ever_stored("message"), said="记住")
                    stored["message (raw, unredacted)"] = sum(
                        1 for b in benign if f"记住{' '.join(b.split())}" in raw or f"记住{b}" in raw
                    )

                    # 2. the model's tool call adds it
                    asks = [f"帮我记一下第{i}条" for i in range(len(cases))]
                    model.tool = dict(zip(asks, cases, strict=True))
                    loop.run_until_complete(send("tool call", asks))
                    texts = {e.text for e in entries_of("tool call")}
                    stored["tool call"] = kept(benign, texts | ever_stored("tool call"))

                    # 3. background extraction returns it as a fact (said in passing, not "记住": only the
                    # extraction stores it; a fact must be grounded in what the person said)
                    asks = [f"我的第{i}件事：{c}" for i, c in enumerate(cases)]
                    model.extract = {f"我的第{i}件事：": c for i, c in enumerate(cases)}
                    loop.run_until_complete(send("extraction", asks))
                    texts = {e.text for e in entries_of("extraction") if e.source == "extract"}
                    stored["extraction"] = sum(1 for b in benign if " ".join(b.split()) in texts)
                finally:
                    loop.close()

            rt = build(Settings(data_dir=data, dream_model=MODEL, ollama_host=ollama.url), server.url)

            # 4. replay: one chat per case (a chunk is one chat), each returning the case as a fact
            hour_ago = datetime.now(UTC) - timedelta(hours=1)  # a second apart: see the replay watermark test
            rows = [
                {
                    "kind": "message",
                    "id": f"rp{i}",
                    "ts": format_time(hour_ago + timedelta(seconds=i)),
                    "speaker": "u",
                    "text": f"我的回放第{i}条：{c}",
                    "chat": f"oc_replay{i:04d}",
                    "chat_type": "p2p",
                }
                for i, c in enumerate(cases)
            ]
            who = people["replay"]
            lucid_import(
                data,
                rows,
                "--tenant",
                TENANT_KEY,
                "--user",
                who.union_id,
                "--persona",
                "x",
                env=clean_env(REDIS_URL=server.url),
                timeout=300,
            )
            model.extract = {f"我的回放第{i}条：": c for i, c in enumerate(cases)}
            replay_runs: list[dict[str, Any]] = []
            while len(replay_runs) < len(cases):
                report = run_phase(rt, ns["replay"], "replay")
                replay_runs.append({"calls": report["llm"]["calls"], **report["counts"]})
                if report["llm"]["calls"] == 0:
                    break
            texts = {e.text for e in rt.writer.snapshot(ns["replay"])[0].entries() if e.source == "replay"}
            stored["replay"] = sum(1 for b in benign if " ".join(b.split()) in texts)

            # 5. a deep-dream merge that slips the secret in (benign look-alikes are "invented": the cage
            #    refuses any merge that adds words, so only secrets are run through it)
            old = format_time(datetime.now(UTC) - timedelta(days=30))
            rt.writer.submit(
                ns["dream merge"],
                [
                    Put(entry={"id": "d1", "text": "我的快递放在前台", "subject": "快递", "at": old}),
                    Put(entry={"id": "d2", "text": "我的快递要本人签收", "subject": "快递", "at": old}),
                ],
            )
            dream = Counter()
            for p in positives:
                model.current = p.text
                report = run_phase(rt, ns["dream merge"], "deep")
                dream.update(report.get("rejections", {}))
            merged = [
                e.text for e in rt.writer.snapshot(ns["dream merge"])[0].entries() if e.source == "dream"
            ]
            stored["dream merge (rejected as secret)"] = dream.get("secret", 0)

            # 6. a profile that slips it in; look-alikes are facts of the person first, so theirs is supported
            profile = Counter()
            for i, case in enumerate(cases):
                is_benign = i >= len(positives)
                rt.writer.submit(
                    ns["profile"],
                    [Remember(text=case if is_benign else f"我的第{i}个爱好是集邮", type="fact")],
                )
                model.current = case
                report = run_phase(rt, ns["profile"], "profile")
                profile.update(report.get("rejections", {}))
                text = rt.store.read_text(ns["profile"], "PROFILE.md") or ""
                if is_benign and " ".join(case.split()) in text:
                    stored["profile"] += 1
            stored["profile (rejected as secret)"] = profile.get("secret", 0)

            # 7. a hand edit of MEMORY.md, then any write
            hand = ns["hand edit"]
            rt.writer.submit(hand, [Remember(text="手工编辑之前的一条")])
            memory = hand.path(data) / "MEMORY.md"
            lines = "".join(f"- {' '.join(c.split())}\n" for c in cases)
            memory.write_text(memory.read_text("utf-8") + lines, "utf-8")
            rt.writer.submit(hand, [Remember(text="手工编辑之后的一条")])
            texts = {e.text for e in rt.writer.snapshot(hand)[0].entries()}
            stored["hand edit"] = sum(1 for b in benign if " ".join(b.split()) in texts)
            logs = {"bot and worker logs": stack.logs_text(), "in-process log records": "\n".join(records)}
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(level)
        server.stop()  # SHUTDOWN: Redis flushes its AOF, which is then searched too
    places = persisted(data, logs)
    owner = {who.union_id: path for path, who in people.items()}
    owner |= {who.union_id: path for path, group in senders.items() for who in group}
    for pid, needle, where in find_secrets(places, positives):
        path = next((owner[u] for u in owner if u in where), f"shared: {where.split('/')[0]}")
        leaks.setdefault(path, []).append((pid, needle, where))
    per_path = {path: len(leaks.get(path, [])) for path in PATHS}
    in_redis = [leak for k, v in leaks.items() if k.startswith("shared: .redis") for leak in v]
    elsewhere = {k: v for k, v in leaks.items() if k not in PATHS and not k.startswith("shared: .redis")}
    figures.update(
        secrets=len(positives),
        benign=len(benign),
        paths=len(PATHS),
        cases_run=len(cases) * 6 + len(positives),
        places_searched=len(places),
        megabytes_searched=round(sum(len(t) for t in places.values()) / 1e6, 1),
        secrets_found_in_clear_by_path=per_path,
        secrets_found_in_clear_elsewhere={k: len(v) for k, v in elsewhere.items()},
        secrets_found_in_redis_aof_under_the_data_dir=len({pid for pid, _, _ in in_redis}),
        benign_stored_by_path=dict(stored),
        dream_merges_accepted=len(merged),
        replay_runs=replay_runs,
        examples=[leak for found in leaks.values() for leak in found][:4],
    )
    assert all(n == 0 for n in per_path.values()) and not elsewhere and not in_redis, {
        p: v[:5] for p, v in leaks.items() if v
    }
    for path in ("message", "message (raw, unredacted)", "tool call", "hand edit"):
        assert stored[path] == len(benign), (path, stored[path], len(benign))


async def test_secrets_never_reach_redis_persistence(
    tmp_path: Path, feishu: FakeFeishu, figures: Figures
) -> None:
    """Was a product bug, found here and fixed (commit ef79454): a secret typed in a message, or handed to
    `manage_memory` by the model, was redacted before any Markdown or git write but reached Redis in clear
    first — the person's inbox entry (the message as JSON) and the writer's op queue (`lucid:ops:*`, the
    Record and Remember ops before the writer redacted or refused them) — and so Redis's AOF, which
    `lucid serve` keeps under the data directory (<data>/.redis/appendonlydir): 28 of 28 secrets."""
    from workers import embedded_redis

    positives = [p for p in POSITIVES if len(p.secret) >= 8][:6]
    data = tmp_path / "data"
    data.mkdir()
    server = embedded_redis.start(data, persist=True)
    model = SecretModel()
    asks = [f"帮我记一下第{i}条" for i in range(len(positives))]
    model.tool = dict(zip(asks, [p.text for p in positives], strict=True))
    who = user("secrets-redis")
    try:
        with (
            FakeOllama(responder=model) as ollama,
            Stack(
                tmp_path, server.url, feishu, bots=1, workers=1, ollama_url=ollama.url, chat_model=MODEL
            ) as stack,
        ):
            base = int(time.time() * 1000)
            events = []
            for i, text in enumerate([p.text for p in positives] + asks):
                ev = message_event(text, sender=who, create_time_ms=base + i)
                feishu.note_message(ev["event"]["message"]["message_id"], ev["event"]["message"]["chat_id"])
                events.append(ev)
            await converse(stack, events, concurrency=4)
            ids = ids_of(events)
            assert await await_for(lambda: all(i in replies_by_parent(feishu) for i in ids), timeout=120)
            stack.settle()
    finally:
        server.stop()
    redis_files = {k: v for k, v in persisted(data, {}).items() if k.startswith(".redis")}
    found = sorted({pid for pid, _, _ in find_secrets(redis_files, positives)})
    figures.update(
        secrets_sent=len(positives) * 2, found_in_redis_files=len(found), files=sorted(redis_files)
    )
    assert found == [], f"{len(found)} of {len(positives)} secrets are in clear in {sorted(redis_files)}"


def test_secrets_fast_subset(tmp_path: Path, feishu: FakeFeishu, figures: Figures) -> None:
    secrets_run(tmp_path, feishu, figures, every=env_int("LUCID_RELIABILITY_SECRETS_EVERY", 30))


@pytest.mark.slow
def test_secrets_full_corpus(tmp_path: Path, feishu: FakeFeishu, figures: Figures) -> None:
    secrets_run(tmp_path, feishu, figures, every=1)
