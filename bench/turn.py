"""Turn benchmark: what a chat turn costs besides the model and Feishu themselves.

    .venv/bin/python bench/turn.py [--turns 300] [--users 20] [--git]

Fake servers answer instantly (tests.fakes: FakeOllama, FakeFeishu, driven by the real ollama and lark-oapi
clients), Redis is a private embedded redis-server, files are real. Three measurements, each over the same
mix of messages (statements that supersede, questions, greetings, explicit remember, commands):

- memory_only: `run_turn` with no chat model, the reply handed to a no-op (pure turn overhead);
- model: `run_turn` with a chat model that answers at once (its HTTP round trip included);
- feishu_job: the RQ job body `handle_message` — inbox, turn lease, "thinking" reaction on and off, the
  model, the reply through the SDK — i.e. everything a worker does per message except dequeuing it.

Prints one JSON object with p50/p95/p99 in milliseconds, and the full garbage collections that fell inside
each measurement (lark-oapi's import leaves ~400 k objects: each full pass stops the process ~250 ms, which
`--freeze` avoids). Goal (DESIGN): overhead p95 ≤ 60 ms.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes.feishu import FakeFeishu
from tests.fakes.ollama import FakeOllama
from workers import embedded_redis
from workers.inbound import Inbound
from workers.llm import LLM
from workers.mailbox import Intake, handle_message
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings
from workers.turn import run_turn

MESSAGES = (
    "我住在余杭区",
    "我在哪",
    "你好",
    "记住我喜欢喝美式咖啡",
    "今天天气不错，适合出去走走",
    "我现在在西湖区",
    "我喜欢喝什么",
    "/memory",
    "以后回答都用中文",
    "where do I live?",
)


def percentiles(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)

    def at(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))], 2)

    return {
        "n": len(ordered),
        "p50_ms": at(50),
        "p95_ms": at(95),
        "p99_ms": at(99),
        "max_ms": round(ordered[-1], 2),
    }


def inbound(i: int, users: int, persona: str, chat_prefix: str = "oc_bench") -> Inbound:
    user = f"bench-user-{i % users}"
    return Inbound(
        tenant="bench",
        user=user,
        open_id=f"ou_{user}",
        persona=persona,
        chat_id=f"{chat_prefix}_{i % users}",
        chat_type="p2p",
        message_id=f"om_{uuid.uuid4().hex}",
        text=MESSAGES[(i // users) % len(MESSAGES)],
        create_time=int(time.time() * 1000),
    )


class FullCollections:
    """Counts full (generation 2) garbage collections and the time they stopped the process for."""

    def __init__(self) -> None:
        self.count, self.ms, self._started = 0, 0.0, 0.0
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.count += 1
            self.ms += (time.perf_counter() - self._started) * 1000

    def take(self) -> dict[str, float]:
        out = {"gc_full_collections": self.count, "gc_full_ms": round(self.ms, 1)}
        self.count, self.ms = 0, 0.0
        return out


def timed(
    turns: int, warmup: int, step: Callable[[int], Any], collections: FullCollections
) -> dict[str, float]:
    for i in range(warmup):
        step(i)
    collections.take()
    ms = []
    cpu = (
        time.process_time()
    )  # this process's CPU (all threads, fakes included): what load elsewhere cannot move
    for i in range(warmup, warmup + turns):
        started = time.perf_counter()
        step(i)
        ms.append((time.perf_counter() - started) * 1000)
    cpu_ms = (time.process_time() - cpu) / turns * 1000
    return {**percentiles(ms), "cpu_ms_per_turn": round(cpu_ms, 2), **collections.take()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--git", action="store_true", help="commit every write to git (the product default)")
    parser.add_argument(
        "--freeze", action="store_true", help="gc.freeze() after start-up, as a long-running worker should"
    )
    args = parser.parse_args()
    collections = FullCollections()
    logging.basicConfig(level=logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="lucid-bench-turn-"))
    redis_server = embedded_redis.start(tmp / "redis", persist=False)
    report: dict[str, Any] = {
        "bench": "turn",
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg()[0],
        "git": args.git,
        "freeze": args.freeze,
        "turns": args.turns,
    }
    try:
        with (
            FakeOllama(models=["bench-model"], default_reply="好的，我明白了。") as ollama,
            FakeFeishu() as feishu,
        ):
            persona = Persona("bench", app_id=f"cli_bench{uuid.uuid4().hex[:8]}", app_secret="s")
            settings = Settings(data_dir=tmp / "data", feishu_domain=feishu.url, personas={"bench": persona})

            def runtime(model: str | None) -> Runtime:
                rt = build(replace(settings, chat_model=model), redis_server.url, git=args.git)
                return replace(rt, llm=LLM(ollama.url, timeout=10, retries=0) if model else None)

            quiet = runtime(None)
            if args.freeze:
                gc.freeze()
            report["memory_only"] = timed(
                args.turns,
                args.users,
                lambda i: run_turn(quiet, inbound(i, args.users, "bench"), lambda _: None),
                collections,
            )
            chatty = runtime("bench-model")
            report["model"] = timed(
                args.turns,
                args.users,
                lambda i: run_turn(chatty, inbound(i, args.users, "bench", "oc_model"), lambda _: None),
                collections,
            )
            intake = Intake(chatty.redis)  # type: ignore[arg-type]

            def job(i: int) -> None:
                message = inbound(i, args.users, "bench", "oc_job")
                feishu.note_message(message.message_id, message.chat_id)
                intake.accept(message)
                with chatty.active():  # as `lucid worker` runs the job
                    handle_message(message.to_json())

            # Distinct chats per user, so the 4/s per-chat pacing does not enter the figure.
            report["feishu_job"] = timed(args.turns, args.users, job, collections)
            report["feishu_calls"] = len(feishu.requests)
    finally:
        redis_server.stop()
    print(json.dumps(report, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
