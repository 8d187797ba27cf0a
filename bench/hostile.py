"""Hostile-traffic benchmark (issue 15): does one person's flood or burst slow down everyone else?

    .venv/bin/python bench/hostile.py [--floods 20,80] [--workers 2] [--long-chars 4000] [--skip-burst]

Through the real stack, as the reliability suite stands it up (tests/reliability/harness.Stack): `lucid bot`
and `lucid worker` processes, a private redis-server, Feishu and Ollama as the local fakes (the chat model
answers at once, so a turn's time is Lucid's own: record, recall, reply, pacing). In one run:

- victim_idle: another person's reply time (webhook POST → the reply recorded by the fake Feishu) with
  nothing else going on, 5 messages one after another;
- victim_under_flood[N]: one person sends N messages (8 at a time, as fast as the webhook takes them), then
  the victim writes once right away and once a second later; their reply times, the flood's drain time, and
  how many flood replies went out between the victim's message and its reply (the order Feishu saw);
- burst: one person sends 8 long messages (`--long-chars` CJK characters each) at once, another 8 short
  ones, one after the other: first POST → last reply of each burst, and the ratio long / short (goal ≤ 4,
  issue 15), through the full turn.

Prints one JSON object. Per-message index cost by message length, in process: bench/index_cost.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import message_event, user
from tests.fakes.ollama import FakeOllama
from tests.reliability.harness import BOT, Stack, chat_responder, converse, ids_of, replies_by_parent
from workers import embedded_redis

MODEL = "bench-model"


def noted(feishu: FakeFeishu, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for ev in events:
        feishu.note_message(ev["event"]["message"]["message_id"], ev["event"]["message"]["chat_id"])
    return events


def events_of(who: Any, texts: list[str]) -> list[dict[str, Any]]:
    base = int(time.time() * 1000)
    return [message_event(t, sender=who, create_time_ms=base + i) for i, t in enumerate(texts)]


def reply_time(feishu: FakeFeishu, message_id: str) -> float | None:
    for m in list(feishu.sent):
        if m.parent_id == message_id:
            return m.time
    return None


async def wait_replies(feishu: FakeFeishu, ids: list[str], timeout: float = 600) -> float:
    """Until every id has a reply; the time of the last one."""
    deadline = time.monotonic() + timeout
    while True:
        got = replies_by_parent(feishu)
        if all(i in got for i in ids):
            return max(got[i][0].time for i in ids)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sum(1 for i in ids if i in got)}/{len(ids)} replies after {timeout}s")
        await asyncio.sleep(0.02)


async def victim_once(stack: Stack, feishu: FakeFeishu, who: Any, text: str) -> tuple[str, float]:
    [ev] = noted(feishu, events_of(who, [text]))
    [message_id] = ids_of([ev])
    sent = time.time()
    await converse(stack, [ev])
    done = await wait_replies(feishu, [message_id])
    return message_id, round((done - sent) * 1000, 1)


async def run(args: argparse.Namespace, stack: Stack, feishu: FakeFeishu) -> dict[str, Any]:
    out: dict[str, Any] = {}
    victim = user("bench-victim")
    await victim_once(stack, feishu, victim, "热身")  # first turn: imports, token, index load
    idle = []
    for i in range(5):
        await asyncio.sleep(0.3)  # past the victim's own chat pacing (4/s): idle means idle
        idle.append((await victim_once(stack, feishu, victim, f"你好，第{i}次"))[1])
    out["victim_idle_ms"] = idle
    floods: dict[str, Any] = {}
    for n in args.floods:
        flooder = user(f"bench-flooder-{n}")
        flood = noted(feishu, events_of(flooder, [f"刷屏消息第{i}条" for i in range(n)]))
        flood_ids = ids_of(flood)
        started = time.time()
        await converse(stack, flood, concurrency=8)
        accepted = time.time()
        await asyncio.sleep(0.3)  # the victim's own pacing, as when idle
        mark = len(feishu.sent)
        first = asyncio.create_task(victim_once(stack, feishu, victim, f"洪水{n}中我的第一条"))
        await asyncio.sleep(1.0)
        second = await victim_once(stack, feishu, victim, f"洪水{n}中我的第二条")
        first_id, first_ms = await first
        drained = await wait_replies(feishu, flood_ids)
        order = [m.parent_id for m in list(feishu.sent)[mark:] if m.parent_id]
        floods[str(n)] = {
            "victim_ms": [first_ms, second[1]],
            "flood_replies_before_victim": order.index(first_id)
            - sum(1 for p in order[: order.index(first_id)] if p not in flood_ids),
            "flood_accept_s": round(accepted - started, 2),
            "flood_drain_s": round(drained - started, 2),
            "busy_notices": sum(
                1
                for m in feishu.sent
                if m.kind == "create" and m.receive_id == flood[0]["event"]["message"]["chat_id"]
            ),
        }
    out["victim_under_flood"] = floods
    idle = sorted(out["victim_idle_ms"])[len(out["victim_idle_ms"]) // 2]
    out["victim_flood_over_idle"] = {n: round(max(f["victim_ms"]) / idle, 1) for n, f in floods.items()}

    if args.skip_burst:
        return out
    rng = random.Random(15)
    bursts: dict[str, float] = {}
    for kind, size in (("short", 12), ("long", args.long_chars)):
        who = user(f"bench-burst-{kind}")
        texts = ["".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(size)) for _ in range(8)]
        events = noted(feishu, events_of(who, texts))
        started = time.time()
        await converse(stack, events, concurrency=8)
        bursts[f"{kind}_s"] = round(await wait_replies(feishu, ids_of(events)) - started, 2)
    bursts["long_over_short"] = round(bursts["long_s"] / bursts["short_s"], 2)
    out["burst_8"] = {"long_chars": args.long_chars, **bursts}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--floods", default="20,80", type=lambda s: [int(x) for x in s.split(",") if x])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--long-chars", type=int, default=4000)
    parser.add_argument("--skip-burst", action="store_true", help="victim latency only")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lucid-bench-hostile-"))
    server = embedded_redis.start(tmp / "redis", persist=False)
    report: dict[str, Any] = {
        "bench": "hostile",
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg()[0],
        "workers": args.workers,
    }
    try:
        with (
            FakeFeishu(bot_open_id=BOT) as feishu,
            FakeOllama(responder=chat_responder()) as ollama,
            Stack(
                tmp / "stack", server.url, feishu, bots=1, workers=args.workers,
                ollama_url=ollama.url, chat_model=MODEL,
            ) as stack,
        ):  # fmt: skip
            report.update(asyncio.run(run(args, stack, feishu)))
    finally:
        server.stop()
    print(json.dumps(report, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
