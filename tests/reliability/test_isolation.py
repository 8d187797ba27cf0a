"""Isolation: no read path shows one namespace's memory to another, or a private chat's to a group.

People in two tenants (the same people, by id, in both), each talking to two personas, in private and in
groups, plant unique markers (`MARK-<12 hex>`) inside ordinary sentences: remembered facts, a standing
preference, chatter that only reaches the raw archive, and old facts bulk-loaded with `lucid import` (so
dreaming has clusters to fold). Then every read path is checked for a marker it may not show:

- turns (through `lucid bot` + `lucid worker` processes): what the chat model was shown (the whole prompt:
  profile, resident tier, recall tier, active recall, history) and the reply Feishu received — in private
  chats and in every group; `/memory` in both;
- `MemoryService`: recall and the assembled memory block per chat, raw-archive search, active recall;
- the viewer's `view()`; the CLI as subprocesses: `lucid recall` (private and `--chat-type group`),
  `lucid search`, `lucid show --all`;
- dreaming, with a model that shows what it was given: deep (echoes its input back as one merge), replay
  (echoes every line back as a fact), profile (echoes its inputs back as the profile) — what each was
  shown, what it wrote, and the turns after it.

Allowed, per (namespace, chat): in a private chat everything of that namespace; in a group only what was
said or learned in that group, plus the speaker's instructions about how to answer (here: one instruction
stated in private) — DESIGN §5; a preference stated in private stays private. Anything else is a leak.
Positive checks: in a group, the speaker's instruction must be in the prompt and the memory block, and what
they learned in that group must be found by recall — so a read path that returns nothing cannot pass.
Target: 0 leaks, 0 misses; the figures count the checks made.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from memory_core.lineformat import format_time
from memory_core.namespace import Namespace
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import TENANT_KEY, group_mention_event, message_event, p2p_chat_id, user
from tests.fakes.ollama import FakeOllama
from tests.reliability.conftest import Figures
from tests.reliability.harness import (
    BOT,
    EXTRACT_PREFIX,
    MARK,
    Stack,
    await_for,
    converse,
    env_int,
    ids_of,
    lucid_cli_batch,
    lucid_import,
    replies_by_parent,
    text_of,
)

MODEL = "qwen3:4b"
TENANTS = (TENANT_KEY, "tenant_b_00000001")
PERSONAS = ("x", "y")


@dataclass(frozen=True)
class Owner:
    tenant: str
    union: str
    persona: str

    @property
    def ns(self) -> Namespace:
        return Namespace.of(self.tenant, self.union, self.persona)


@dataclass
class Plant:
    marker: str
    owner: Owner
    chat: str  # chat id; for p2p the person's private chat
    group: bool
    kind: str  # fact, pref, raw, old


@dataclass
class World:
    rng: random.Random
    plants: dict[str, Plant] = field(default_factory=dict)
    checks: Counter[str] = field(default_factory=Counter)
    leaks: list[tuple[str, str, str]] = field(default_factory=list)
    misses: list[tuple[str, str, str]] = field(default_factory=list)
    shown_as_required: Counter[str] = field(default_factory=Counter)

    def mark(self, owner: Owner, chat: str, group: bool, kind: str) -> str:
        marker = f"MARK-{self.rng.getrandbits(48):012x}"
        self.plants[marker] = Plant(marker, owner, chat, group, kind)
        return marker

    def allowed(self, owner: Owner, chat: str | None) -> set[str]:
        """What a read as `owner` in `chat` (None: the whole namespace, e.g. an operator view) may show."""
        own = [p for p in self.plants.values() if p.owner == owner]
        if chat is None or not chat.startswith("oc_relgrp"):
            return {p.marker for p in own}
        return {p.marker for p in own if p.chat == chat or p.kind == "instr"}

    def expect(
        self,
        surface: str,
        owner: Owner,
        chat: str,
        shown: str,
        kinds: tuple[str, ...],
        current: str | None = None,
    ) -> None:
        """Positive check: the owner's markers of `kinds` permitted in `chat` must be in `shown` (with
        `current`, the text of the namespace's current entries: only those still current there)."""
        self.checks[f"{surface} (positive)"] += 1
        wanted = {
            p.marker
            for p in self.plants.values()
            if p.owner == owner
            and p.kind in kinds
            and (p.kind == "instr" or p.chat == chat)
            and (current is None or p.marker in current)
        }
        for marker in wanted - set(MARK.findall(shown)):
            self.misses.append(
                (surface, f"{owner} in {chat}", f"{marker} ({self.plants[marker].kind}) missing")
            )

    def check(
        self, surface: str, owner: Owner, chat: str | None, shown: str, extra: set[str] = frozenset()
    ) -> None:
        self.checks[surface] += 1
        for marker in set(MARK.findall(shown)) - self.allowed(owner, chat) - set(extra):
            plant = self.plants.get(marker)
            origin = f"{plant.owner} {plant.kind} in {plant.chat}" if plant else "unknown"
            self.leaks.append((surface, f"{owner} in {chat}", f"{marker} ← {origin}"))

    def own(self, owner: Owner, *kinds: str, chat: str | None = None) -> set[str]:
        """The markers `owner` planted, of these kinds (in `chat` only, if given)."""
        return {
            p.marker
            for p in self.plants.values()
            if p.owner == owner and p.kind in kinds and (chat is None or p.chat == chat)
        }

    def must_show(self, surface: str, owner: Owner, chat: str | None, shown: str, must: set[str]) -> None:
        """Positive check: counting leaks alone would pass a read path that returns nothing, so every read
        path must also show what it is asked for — a permitted marker (the locker fact asked for in private,
        the raw chatter in a raw search, every remembered marker in the operator's views and files)."""
        assert must <= self.allowed(owner, chat), (surface, "the test asks for a marker it may not see")
        if not must:
            return
        self.shown_as_required[surface] += 1
        for marker in sorted(must - set(MARK.findall(shown))):
            plant = self.plants[marker]
            self.misses.append((surface, f"{owner} in {chat}", f"{marker} ({plant.kind}) missing"))


class EchoModel:
    """A model that shows what it was given: turns are answered with every marker in the prompt, deep
    dreaming merges whatever it is shown, replay returns each line as a fact, profile returns its inputs.
    Background extraction after a turn answers NONE (replay mode on: the replay phase's extraction)."""

    def __init__(self) -> None:
        self.replay = False
        self.seen: list[tuple[str, str]] = []  # (kind, the request as text)
        self.asked: list[str] = []  # for turns: the person's message the request answers

    def __call__(self, body: dict[str, Any]) -> Any:
        messages = body.get("messages") or []
        system = str(messages[0].get("content") or "")
        text = json.dumps(messages, ensure_ascii=False)
        user_part = str(messages[-1].get("content") or "") if messages else ""
        if system.startswith(EXTRACT_PREFIX):
            self.seen.append(("replay" if self.replay else "extract", text))
            if not self.replay:
                return "NONE"
            lines = [ln for ln in user_part.splitlines()[1:] if MARK.search(ln)]
            return "\n".join(f"[user] {ln.strip()}" for ln in lines) or "NONE"
        if '"merges"' in system:
            self.seen.append(("deep", text))
            payload = json.loads(user_part)
            memories = payload["memories"]
            merged = "；".join(m["text"] for m in memories)
            return json.dumps(
                {"merges": [{"ids": [m["id"] for m in memories], "text": merged}]}, ensure_ascii=False
            )
        if "profile of ONE person" in system:
            self.seen.append(("profile", text))
            return "\n".join(ln.split(") ", 1)[-1] for ln in user_part.splitlines() if ln.startswith("- ("))
        self.seen.append(("turn", text))
        self.asked.append(
            next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        )
        found = sorted(set(MARK.findall(text)))
        return "我看到了：" + (" ".join(found) if found else "（没有标记）")


async def isolation_run(
    tmp_path: Path,
    redis_url: str,
    feishu: FakeFeishu,
    figures: Figures,
    people: int,
    groups: int,
    seed: int,
    cli_namespaces: int,
    questions: tuple[str, ...] = ("我的储物柜编号是多少", "我在这个群的代号是什么", "/memory"),
    group_chatter: bool = False,
) -> None:
    phases: dict[str, float] = {}
    t0 = time.monotonic()

    def lap(name: str) -> None:
        phases[name] = round(time.monotonic() - t0 - sum(phases.values()), 1)

    world = World(random.Random(seed))
    persons = [user(f"iso-{seed}-{i}") for i in range(people)]
    chats = [f"oc_relgrp{g:02d}{'0' * 22}" for g in range(groups)]
    member = {p.union_id: world.rng.sample(chats, min(2, groups)) for p in persons}
    owners = [Owner(t, p.union_id, persona) for t in TENANTS for p in persons for persona in PERSONAS]
    by_union = {p.union_id: p for p in persons}
    clock = int(time.time() * 1000)
    model = EchoModel()

    def event(owner: Owner, text: str, chat: str | None) -> tuple[dict[str, Any], str]:
        nonlocal clock
        clock += 1
        who = by_union[owner.union]
        if chat is None:
            ev = message_event(text, sender=who, create_time_ms=clock, tenant_key=owner.tenant)
        else:
            ev = group_mention_event(
                text, bot_open_id=BOT, sender=who, chat_id=chat, create_time_ms=clock, tenant_key=owner.tenant
            )
        feishu.note_message(ev["event"]["message"]["message_id"], ev["event"]["message"]["chat_id"])
        return ev, (chat or p2p_chat_id(who))

    with FakeOllama(responder=model) as ollama:
        stack = Stack(tmp_path, redis_url, feishu, bots=1, workers=2, ollama_url=ollama.url, chat_model=MODEL)
        with stack:
            # -- plant -----------------------------------------------------------------------
            plant_events: dict[str, list[dict[str, Any]]] = {"x": [], "y": []}
            for owner in owners:
                p2p = p2p_chat_id(by_union[owner.union])
                texts = [
                    (f"记住我的储物柜编号是{world.mark(owner, p2p, False, 'fact')}", None),
                    (f"记住我喜欢{world.mark(owner, p2p, False, 'pref')}牌的咖啡", None),
                    (f"记住以后回答我时先说{world.mark(owner, p2p, False, 'instr')}", None),
                    (f"今天路过一块牌子写着{world.mark(owner, p2p, False, 'raw')}", None),
                ]
                for chat in member[owner.union]:
                    texts.append((f"记住我在这个群的代号是{world.mark(owner, chat, True, 'fact')}", chat))
                    if group_chatter:
                        texts.append((f"刚才会议室门口贴着{world.mark(owner, chat, True, 'raw')}", chat))
                plant_events[owner.persona] += [event(owner, t, c)[0] for t, c in texts]
            for persona, events in plant_events.items():
                await converse(stack, events, persona=persona, concurrency=8)
            every = [e for evs in plant_events.values() for e in evs]
            assert await await_for(
                lambda: all(i in replies_by_parent(feishu) for i in ids_of(every)), timeout=300
            )
            stack.settle()

            lap("plant")
            # old facts through `lucid import`, so deep dreaming has clusters (same subject, 30 days old)
            old = format_time(datetime.now(UTC) - timedelta(days=30))
            rows = []
            for owner in owners:
                p2p = p2p_chat_id(by_union[owner.union])
                for scope, chat, group in [("p2p", p2p, False)] + [
                    (f"g:{c}", c, True) for c in member[owner.union][:1]
                ]:
                    for n in range(2):
                        m = world.mark(owner, chat, group, "old")
                        rows.append(
                            {
                                "kind": "fact",
                                "text": f"我的旧储物柜{n}号的标签是{m}",
                                "subject": "旧储物柜",
                                "at": old,
                                "scope": scope,
                                "tenant": owner.tenant,
                                "user": owner.union,
                                "persona": owner.persona,
                            }
                        )
            lucid_import(stack.data, rows)

            from workers.dreaming import run_phase
            from workers.runtime import build
            from workers.settings import Settings

            lap("import")
            rt = build(Settings(data_dir=stack.data, dream_model=MODEL, ollama_host=ollama.url), redis_url)
            # -- dreaming, with a model that shows what it was given ------------------------------
            reports: Counter[str] = Counter()
            for phase in ("deep", "replay", "profile"):
                model.replay = phase == "replay"
                for owner in owners:
                    start = len(model.seen)
                    report = run_phase(rt, owner.ns, phase)
                    reports[f"{phase}:{report['status']}"] += 1
                    for kind, text in model.seen[start:]:
                        if kind == "deep":  # one cluster = one scope: never private text with group text
                            chats = {world.plants[m].chat for m in MARK.findall(text) if m in world.plants}
                            world.checks["deep: one scope per cluster"] += 1
                            if len({(c.startswith("oc_relgrp") and c) or "p2p" for c in chats}) > 1:
                                world.leaks.append(("deep cluster mixes scopes", str(owner), text[:200]))
                            world.check("deep: what the model was shown", owner, None, text)
                        elif kind == "replay":
                            world.check("replay: what the model was shown", owner, None, text)
                        elif kind == "profile":  # never group-learned facts
                            world.check(
                                "profile: what the model was shown",
                                owner,
                                p2p_chat_id(by_union[owner.union]),
                                text,
                                extra=set(),
                            )
                            shown = set(MARK.findall(text))
                            bad = [m for m in shown if world.plants.get(m) and world.plants[m].group]
                            world.checks["profile: no group-learned fact"] += 1
                            if bad:
                                world.leaks.append(
                                    ("profile input has a group fact", str(owner), ",".join(bad))
                                )
                    profile = rt.store.read_text(owner.ns, "PROFILE.md") or ""
                    world.check(
                        f"{phase}: files after",
                        owner,
                        None,
                        "".join(
                            rt.store.read_text(owner.ns, n) or ""
                            for n in ("MEMORY.md", "ARCHIVE.md", "PROFILE.md", "DREAMS.md")
                        ),
                    )
                    world.must_show(
                        f"{phase}: files after",
                        owner,
                        None,
                        "".join(rt.store.read_text(owner.ns, n) or "" for n in ("MEMORY.md", "ARCHIVE.md")),
                        world.own(owner, "fact", "pref", "old"),  # dreaming loses nothing
                    )
                    if phase == "profile":
                        groupish = [
                            m for m in MARK.findall(profile) if m in world.plants and world.plants[m].group
                        ]
                        world.checks["PROFILE.md: no group-learned fact"] += 1
                        if groupish:
                            world.leaks.append(
                                ("PROFILE.md has a group fact", str(owner), ",".join(groupish))
                            )
            model.replay = False
            lap("dreams")

            # -- read, as the person, in every chat ----------------------------------------------
            def required(owner: Owner, where: str, asked: str) -> set[str]:
                """What a read must show for a question asked in chat `where`: the permitted answer."""
                private = not where.startswith("oc_relgrp")
                if "旧储物柜" in asked:
                    return world.own(owner, "old", chat=where) if private else set()
                if "储物柜" in asked:  # the locker number, stated in private
                    return world.own(owner, "fact", chat=where) if private else set()
                if "代号" in asked:  # the code name, stated in this group
                    return set() if private else world.own(owner, "fact", chat=where)
                if asked.startswith("/memory"):  # lists what this chat may see: its own facts at least
                    return world.own(owner, "fact", chat=where)
                return set()

            async def probe(round_name: str) -> None:
                probes: dict[str, list[tuple[dict[str, Any], Owner, str]]] = {"x": [], "y": []}
                tags: dict[str, tuple[Owner, str]] = {}
                for owner in owners:
                    for chat in [None, *member[owner.union]]:
                        for q in questions:
                            tag = f"（问题{len(tags) + 1:05d}）"
                            ev, where = event(owner, q if q.startswith("/") else q + tag, chat)
                            tags[tag] = (owner, where)
                            probes[owner.persona].append((ev, owner, where))
                start = len(model.asked)
                for persona, items in probes.items():
                    await converse(stack, [ev for ev, _, _ in items], persona=persona, concurrency=8)
                items = [it for v in probes.values() for it in v]
                probe_ids = ids_of(ev for ev, _, _ in items)
                assert await await_for(
                    lambda: all(i in replies_by_parent(feishu) for i in probe_ids), timeout=300
                )
                stack.settle()
                for ev, owner, where in items:
                    mid = ids_of([ev])[0]
                    shown = "\n".join(text_of(m) for m in replies_by_parent(feishu)[mid])
                    world.check(f"{round_name}: reply in Feishu", owner, where, shown)
                turns = [t for kind, t in model.seen if kind == "turn"][start:]
                for asked, prompt in zip(model.asked[start:], turns, strict=True):
                    tag = next((t for t in tags if t in asked), None)
                    assert tag is not None, asked
                    owner, where = tags[tag]
                    world.check(f"{round_name}: model prompt", owner, where, prompt)
                    if where.startswith("oc_relgrp"):
                        world.expect(f"{round_name}: group prompt", owner, where, prompt, ("instr",))
                for asked, prompt in zip(model.asked[start:], turns, strict=True):
                    owner, where = next(tags[t] for t in tags if t in asked)
                    world.must_show(
                        f"{round_name}: model prompt", owner, where, prompt, required(owner, where, asked)
                    )
                for ev, owner, where in items:
                    shown = "\n".join(text_of(m) for m in replies_by_parent(feishu)[ids_of([ev])[0]])
                    asked = json.loads(ev["event"]["message"]["content"])["text"]
                    world.must_show(
                        f"{round_name}: reply in Feishu", owner, where, shown, required(owner, where, asked)
                    )

            await probe("turns after dreams")
            lap("turns")

            # -- in process: MemoryService, viewer ----------------------------------------------
            from bot.viewer import view
            from workers.memory_service import MemoryService

            service = MemoryService(rt)
            now = rt.clock()
            queries = ["我的储物柜编号是多少", "代号", "牌子", "旧储物柜的标签", "MARK"]
            for owner in owners:
                p2p = p2p_chat_id(by_union[owner.union])
                for chat in [p2p, *member[owner.union]]:
                    group = chat != p2p
                    ct = "group" if group else "p2p"
                    for q in queries:
                        hits = service.recall(owner.ns, q, now, k=50, chat_type=ct, chat=chat, gate=False)
                        world.check("MemoryService.recall", owner, chat, " ".join(s.entry.text for s in hits))
                        block = service.assemble(
                            owner.ns, q, chat_type=ct, chat=chat, session=f"s-{time.time()}", now=now
                        )
                        world.check("MemoryService.assemble (memory block)", owner, chat, block.block)
                        # Group chats too: what was said in a group stays current there (it was being struck
                        # by what the person said in another group; fixed, see docs/TESTING.md).
                        must = required(owner, chat, q)
                        world.must_show(
                            "MemoryService.recall", owner, chat, " ".join(s.entry.text for s in hits), must
                        )
                        world.must_show(
                            "MemoryService.assemble (memory block)", owner, chat, block.block, must
                        )
                        if group:
                            world.expect("group memory block", owner, chat, block.block, ("instr",))
                    if group:
                        hits = service.recall(
                            owner.ns, "代号", now, k=50, chat_type=ct, chat=chat, gate=False
                        )
                        shown = " ".join(s.entry.text for s in hits)
                        live = " ".join(e.text for e in service.book(owner.ns).current(now))
                        world.expect("MemoryService.recall in a group", owner, chat, shown, ("fact",), live)
                for q in queries:
                    world.check(
                        "MemoryService.search (raw)",
                        owner,
                        None,
                        " ".join(h.text for h in service.search(owner.ns, q, k=50)),
                    )
                    if q == "牌子":
                        raw_hits = " ".join(h.text for h in service.search(owner.ns, q, k=50))
                        world.must_show(
                            "MemoryService.search (raw)", owner, p2p, raw_hits, world.own(owner, "raw")
                        )
                    snippets = service.active_recall(owner.ns, q, session="none", chat=p2p)
                    world.check("MemoryService.active_recall", owner, p2p, " ".join(s.text for s in snippets))
                    world.check(
                        "viewer view()",
                        owner,
                        None,
                        json.dumps(view(rt, service, owner.ns, q), ensure_ascii=False),
                    )
                world.must_show(
                    "viewer view()",
                    owner,
                    None,
                    json.dumps(view(rt, service, owner.ns, ""), ensure_ascii=False),
                    world.own(owner, "fact", "pref", "old"),  # the operator's view shows the whole namespace
                )

            lap("in-process reads")
            # -- the CLI, as an operator runs it --------------------------------------------------
            for owner in owners[:cli_namespaces]:
                ids = ["--tenant", owner.tenant, "--user", owner.union, "--persona", owner.persona, "--json"]
                group = member[owner.union][0]
                private = p2p_chat_id(by_union[owner.union])
                # one process runs them all (`bot.cli:main` per command): 7 process start-ups were 16 s
                recall, grouped, search, show, recall_own, search_own, show_all = (
                    run.stdout
                    for run in lucid_cli_batch(
                        stack.data,
                        [
                            ["recall", "储物柜 代号 牌子 MARK", "--k", "50", "--no-gate", *ids],
                            [
                                "recall",
                                "储物柜 代号 牌子 MARK",
                                "--k",
                                "50",
                                "--no-gate",
                                "--chat-type",
                                "group",
                                "--chat",
                                group,
                                *ids,
                            ],
                            ["search", "牌子 MARK 储物柜", "--k", "50", *ids],
                            ["show", "--all", *ids],
                            ["recall", "我的储物柜编号是多少", "--k", "50", "--no-gate", *ids],
                            ["search", "牌子", "--k", "50", *ids],
                            ["show", "--all", *ids],
                        ],
                    )
                )
                world.check("lucid recall", owner, None, recall)
                world.check("lucid recall --chat-type group", owner, group, grouped)
                live = " ".join(e.text for e in service.book(owner.ns).current(rt.clock()))
                world.expect("lucid recall --chat-type group", owner, group, grouped, ("fact",), live)
                world.check("lucid search", owner, None, search)
                world.check("lucid show --all", owner, None, show)
                world.must_show(
                    "lucid recall", owner, None, recall_own, world.own(owner, "fact", chat=private)
                )
                world.must_show(
                    "lucid search", owner, None, search_own, world.own(owner, "raw", chat=private)
                )
                world.must_show(
                    "lucid show --all", owner, None, show_all, world.own(owner, "fact", "pref", "old")
                )

        lap("cli")
    assert world.leaks == [], f"{len(world.leaks)} leaks, e.g. {world.leaks[:5]}"
    assert world.misses == [], f"{len(world.misses)} permitted markers missing, e.g. {world.misses[:5]}"
    figures.update(
        tenants=len(TENANTS),
        people=people,
        personas=len(PERSONAS),
        namespaces=len(owners),
        groups=groups,
        markers_planted=len(world.plants),
        checks=sum(world.checks.values()),
        checks_by_surface=dict(world.checks),
        dream_runs=dict(reports),
        model_requests_inspected=len(model.seen),
        leaks=0,
        seconds=phases,
    )
    # Every kind of read path was also checked for what it must show, and showed it.
    assert world.misses == [], f"{len(world.misses)} permitted markers missing, e.g. {world.misses[:5]}"
    surfaces = {s.split(": ")[-1] for s in world.shown_as_required}
    assert surfaces >= {
        "files after",
        "model prompt",
        "reply in Feishu",
        "MemoryService.recall",
        "MemoryService.assemble (memory block)",
        "MemoryService.search (raw)",
        "viewer view()",
        "lucid recall",
        "lucid search",
        "lucid show --all",
    }, dict(world.shown_as_required)
    figures.update(required_shown=sum(world.shown_as_required.values()), misses=0)


async def test_isolation_fast_subset(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, feishu: FakeFeishu, figures: Figures
) -> None:
    await isolation_run(
        tmp_path,
        redis_url,
        feishu,
        figures,
        people=env_int("LUCID_RELIABILITY_ISO_PEOPLE", 2),
        groups=2,
        seed=env_int("LUCID_RELIABILITY_SEED", 1),
        cli_namespaces=1,
    )


@pytest.mark.slow
async def test_isolation_full(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, feishu: FakeFeishu, figures: Figures
) -> None:
    await isolation_run(
        tmp_path,
        redis_url,
        feishu,
        figures,
        people=env_int("LUCID_RELIABILITY_ISO_FULL_PEOPLE", 8),
        groups=4,
        seed=env_int("LUCID_RELIABILITY_SEED", 1) + 1000,
        cli_namespaces=8,
        questions=(
            "我的储物柜编号是多少",
            "我在这个群的代号是什么",
            "路过的牌子写着什么",
            "旧储物柜的标签是什么",
            "我喜欢什么牌子的咖啡",
            "/memory",
        ),
        group_chatter=True,
    )
