"""Hostile-traffic benchmark (issue 15): does one person's flood or burst slow down everyone else?

    .venv/bin/python bench/hostile.py [--floods 20,80] [--workers 2] [--long-chars 4000] [--skip-burst]
                                      [--victim-samples 8]

Through the real stack, as the reliability suite stands it up (tests/reliability/harness.Stack): `lucid bot`
and `lucid worker` processes, a private redis-server, Feishu and Ollama as the local fakes (the chat model
answers at once, so a turn's time is Lucid's own: record, recall, reply, pacing). In one run:

- victim_idle: another person's reply time (webhook POST → the reply recorded by the fake Feishu) with
  nothing else going on, 5 messages one after another;
- victim_under_flood[N]: one person sends N messages (8 at a time, as fast as the webhook takes them), then
  the victim writes once right away and once a second later; their reply times, the flood's drain time, and
  how many flood replies went out between the victim's message and its reply (the order Feishu saw); then
  more victim messages while the flood drains (`--victim-samples` in all), each split by the fake's clock
  into the wait for a worker (POST → its "thinking" reaction) and its turn (reaction → reply), medians;
- burst: one person sends 8 long messages (`--long-chars` CJK characters each) at once, another 8 short
  ones, one after the other: first POST → last reply of each burst, and the ratio long / short (goal ≤ 4,
  issue 15), through the full turn.

- pacer_probe (first, in process): while one worker's three-part answer to a chat is paced, another worker
  replies to another chat of the same app; that reply's time (the fake answers at once).

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


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[len(ordered) // 2], 1) if ordered else 0.0


POSTED: dict[str, float] = {}  # message id → when the bench POSTed it


def split_of(feishu: FakeFeishu, message_id: str) -> tuple[float, float]:
    """(POST → the message's reaction, reaction → its reply), in ms, by the fake's clock."""
    reacted = min(r.time for r in feishu.reactions if r.message_id == message_id)
    replied = min(m.time for m in feishu.sent if m.parent_id == message_id)
    return (reacted - POSTED[message_id]) * 1000, (replied - reacted) * 1000


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
    sent = POSTED[message_id] = time.time()
    await converse(stack, [ev])
    done = await wait_replies(feishu, [message_id])
    return message_id, round((done - sent) * 1000, 1)


async def run(args: argparse.Namespace, stack: Stack, feishu: FakeFeishu) -> dict[str, Any]:
    out: dict[str, Any] = {}
    victim = user("bench-victim")
    await victim_once(stack, feishu, victim, "热身")  # first turn: imports, token, index load
    idle, idle_ids = [], []
    for i in range(5):
        await asyncio.sleep(0.3)  # past the victim's own chat pacing (4/s): idle means idle
        message_id, ms = await victim_once(stack, feishu, victim, f"你好，第{i}次")
        idle.append(ms)
        idle_ids.append(message_id)
    out["victim_idle_ms"] = idle
    out["victim_idle_wait_for_worker_ms"] = median([split_of(feishu, m)[0] for m in idle_ids])
    out["victim_idle_turn_ms"] = median([split_of(feishu, m)[1] for m in idle_ids])
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
        samples = [split_of(feishu, first_id), split_of(feishu, second[0])]
        for i in range(args.victim_samples - 2):  # more, while the flood still drains
            if all(m in replies_by_parent(feishu) for m in flood_ids):
                break
            await asyncio.sleep(0.3)
            samples.append(split_of(feishu, (await victim_once(stack, feishu, victim, f"洪水{n}中{i}"))[0]))
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
            # every victim message during the flood, by the fake's clock: POST → its "thinking" reaction (a
            # worker took it) and reaction → reply (its turn, pacing included); medians
            "victim_samples": len(samples),
            "victim_wait_for_worker_ms": median([w for w, _ in samples]),
            "victim_turn_ms": median([t for _, t in samples]),
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


def pacer_probe(redis_url: str, feishu: FakeFeishu, rounds: int = 6) -> dict[str, Any]:
    """In process, the real FeishuSender and Pacer against the fake: while one worker's three-part answer
    to chat A is paced (4/s per chat), another worker replies to chat B; B's reply call → done, in ms (the
    fake answers at once, so what is left is waiting for a send slot). Two senders of one app, as two
    workers are."""
    import threading

    import redis

    from workers.feishu_send import FeishuSender, Pacer, Retry
    from workers.settings import Persona

    client = redis.Redis.from_url(redis_url)
    persona = Persona("probe", app_id="cli_pacerprobe0001", app_secret="s")
    first, second = (
        FeishuSender(persona, feishu.url, client, retry=Retry(attempts=1), pacer=Pacer(client)) for _ in "ab"
    )
    long_answer = "\n\n".join(f"第{i}段：" + "很长的回答。" * 400 for i in range(3))
    samples = []
    for r in range(rounds + 1):
        chat_a, chat_b = f"oc_probe_a{r}", f"oc_probe_b{r}"
        mid_a, mid_b = f"om_probe_a{r}", f"om_probe_b{r}"
        feishu.note_message(mid_a, chat_a)
        feishu.note_message(mid_b, chat_b)
        worker = threading.Thread(target=first.reply, args=(mid_a, long_answer), kwargs={"chat_id": chat_a})
        worker.start()
        deadline = time.monotonic() + 10
        while first.pacer.ahead(chat_a) < 0.3 and time.monotonic() < deadline:  # part 2 waits for its slot
            time.sleep(0.002)
        started = time.perf_counter()
        second.reply(mid_b, "别人的回答", chat_id=chat_b)
        if r:  # the first round warms the tokens
            samples.append((time.perf_counter() - started) * 1000)
        worker.join(10)
        time.sleep(0.6)  # chat A's pacing and the app's clear before the next round
    client.close()
    return {"rounds": rounds, "other_chat_reply_ms": median(samples), "max_ms": round(max(samples), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--floods", default="20,80", type=lambda s: [int(x) for x in s.split(",") if x])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--long-chars", type=int, default=4000)
    parser.add_argument("--skip-burst", action="store_true", help="victim latency only")
    parser.add_argument("--victim-samples", type=int, default=8, help="victim messages per flood")
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
            report["pacer_probe"] = pacer_probe(server.url, feishu)
            report.update(asyncio.run(run(args, stack, feishu)))
    finally:
        server.stop()
    print(json.dumps(report, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
