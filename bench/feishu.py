"""Feishu connection benchmark: long connection vs webhook, and streaming cards vs plain replies.

    .venv/bin/python bench/feishu.py [--messages 30] [--tokens 200] [--rate 20] [--streams 3] [--json]

One run stands up the real pieces: a private redis-server, the bot (`bot.app.create_app`, served by aiohttp
in this process) with one persona in `mode = "ws"` whose webhook also answers, a real `lucid worker`
process, the fake Feishu open API with CardKit (tests.fakes.feishu_cards) and the fake long-connection
endpoint (tests.fakes.feishu_ws) the real lark.ws.Client connects to, and FakeOllama.

1. event → reply, memory-only turns (so the transport is what differs): the same messages alternately
   POSTed to the webhook (signed and encrypted) and pushed over the long connection; the time until the
   fake Feishu records the reply. p50/p95 per path.
2. streaming: a chat model streams `--tokens` tokens at `--rate` tokens/s. Time from the event to the first
   visible text in the card (the card's creation, with its first words) vs to the whole plain reply (the
   same answer with CardKit refused), and card-update calls per reply under the throttle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp import web

from bot.app import create_app
from tests.fakes.feishu_cards import FakeFeishuCards
from tests.fakes.feishu_events import ALICE, deliver, message_event, user
from tests.fakes.feishu_ws import FakeFeishuWS
from tests.fakes.ollama import FakeOllama, Paced
from workers import embedded_redis
from workers.runtime import build
from workers.settings import Settings

APP, SECRET, KEY, TOKEN, BOT = "cli_bench", "bench-secret", "bench-key", "bench-token", "ou_bench_bot"
ROOT = Path(__file__).resolve().parent.parent


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else 0.0


def _toml(path: Path, domain: str) -> Path:
    path.write_text(
        f'[personas.p]\napp_id = "{APP}"\napp_secret = "{SECRET}"\nverification_token = "{TOKEN}"\n'
        f'encrypt_key = "{KEY}"\nmode = "ws"\ndomain = "{domain}"\nbot_open_id = "{BOT}"\n',
        "utf-8",
    )
    return path


class Bot:
    """The bot app on its own thread and loop, like `lucid bot`."""

    def __init__(self, settings: Settings, redis_url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.runtime = build(settings, redis_url=redis_url)
        self.port = 0
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(30)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            self.runner = web.AppRunner(create_app(self.runtime), access_log=None)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    def post(self, body: bytes, headers: dict[str, str]) -> int:
        import urllib.request

        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/feishu/p/events", data=body, headers=headers, method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _wait_reply(feishu: FakeFeishuCards, message_id: str, timeout: float = 60.0) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with feishu.lock:
            for m in feishu.sent:
                if m.parent_id == message_id:
                    return m.time
        time.sleep(0.002)
    return None


def _event(text: str, who: Any, feishu: FakeFeishuCards) -> dict[str, Any]:
    event = message_event(text, sender=who, app_id=APP, token=TOKEN)
    message = event["event"]["message"]
    feishu.note_message(message["message_id"], message["chat_id"])
    return event


def transport(feishu: FakeFeishuCards, ws: FakeFeishuWS, bot: Bot, n: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"webhook": [], "ws": []}
    texts = ["我住在余杭区", "我在哪", "记住我喜欢喝美式咖啡", "我喜欢喝什么", "你好"]
    for i in range(-1, n):  # round -1 warms both paths up and is not counted
        for path in ("webhook", "ws"):
            who = user(f"bench-{path}-{i % 5}")
            event = _event(texts[i % len(texts)], who, feishu)
            mid = event["event"]["message"]["message_id"]
            started = time.time()
            if path == "webhook":
                d = deliver(event, encrypt_key=KEY)
                assert bot.post(d.body, d.headers) == 200
            else:
                frame = ws.push(event)
                assert ws.ack(frame) == 200
            done = _wait_reply(feishu, mid)
            if done is not None and i >= 0:
                times[path].append((done - started) * 1000)
    return {
        path: {
            "n": len(v),
            "p50_ms": _pct(v, 0.5),
            "p95_ms": _pct(v, 0.95),
            "mean_ms": round(statistics.mean(v), 1),
        }
        for path, v in times.items()
        if v
    }


def streaming(
    feishu: FakeFeishuCards,
    ollama: FakeOllama,
    ws: FakeFeishuWS,
    client: Any,
    tokens: int,
    rate: float,
    streams: int,
) -> dict[str, Any]:
    sentence = "春天的西湖很美，苏堤上的桃花开了，湖面上有小船慢慢划过。"
    answer = (sentence * (tokens // len(sentence) + 1))[:tokens]  # one token per character (the fake's count)
    first_visible, card_whole, plain_whole, updates = [], [], [], []
    for i in range(-2, streams * 2):  # the first pair warms up and is not counted
        card_mode = i % 2 == 0
        feishu.refuse_cards(not card_mode)
        client.delete(f"lucid:flag:cards-refused:{APP}")  # the refusal memo would keep cards off
        ollama.script(Paced(answer, tokens_per_second=rate))
        event = _event(f"讲个长故事 {i}", ALICE, feishu)
        mid = event["event"]["message"]["message_id"]
        started = time.time()
        ws.ack(ws.push(event))
        done = _wait_reply(feishu, mid, timeout=tokens / rate * 4 + 30)
        if done is None or i < 0:
            continue
        if card_mode:
            card = feishu.card_of(next(m.message_id for m in feishu.sent if m.parent_id == mid))
            if card is None:
                continue
            deadline = time.monotonic() + 30
            while card.streaming and time.monotonic() < deadline:
                time.sleep(0.01)
            first_visible.append((card.created_at - started) * 1000)
            card_whole.append(((card.updates[-1][0] if card.updates else card.created_at) - started) * 1000)
            updates.append(len(card.updates) + 2)  # content updates + create + settings
        else:
            plain_whole.append((done - started) * 1000)
    return {
        "tokens": tokens,
        "tokens_per_second": rate,
        "first_visible_text_ms": {"p50": _pct(first_visible, 0.5), "all": [round(v) for v in first_visible]},
        "whole_answer_in_card_ms": {"p50": _pct(card_whole, 0.5)},
        "whole_plain_reply_ms": {"p50": _pct(plain_whole, 0.5), "all": [round(v) for v in plain_whole]},
        "card_calls_per_reply": updates,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="lucid-bench-feishu-"))
    server = embedded_redis.start(tmp / "r", persist=False)
    with (
        FakeFeishuCards(bot_open_id=BOT, app_secret=SECRET) as feishu,
        FakeOllama() as ollama,
        FakeFeishuWS(APP, SECRET, ping_interval=30, api=feishu) as ws,
    ):
        if True:
            config = _toml(tmp / "lucid.toml", ws.url)
            env = {k: v for k, v in os.environ.items() if not k.startswith("LUCID_")}
            env.update(REDIS_URL=server.url, LUCID_DATA=str(tmp / "data"), LUCID_CONFIG=str(config))
            figures: dict[str, Any] = {}
            settings = Settings.from_env(env)
            bot = Bot(settings, server.url)
            deadline = time.monotonic() + 30
            while not ws.live and time.monotonic() < deadline:
                time.sleep(0.05)

            def worker(extra: dict[str, str]) -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    [sys.executable, "-m", "bot.cli", "worker"], cwd=ROOT, env={**env, **extra},
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip

            proc = worker({})
            try:
                time.sleep(3)
                figures["event_to_reply_memory_only"] = transport(feishu, ws, bot, args.messages)
            finally:
                proc.terminate()
                proc.wait(60)
            proc = worker({"LUCID_CHAT_MODEL": "qwen3:4b", "OLLAMA_HOST": ollama.url})
            try:
                time.sleep(3)
                import redis

                client = redis.Redis.from_url(server.url)
                figures["streaming"] = streaming(
                    feishu, ollama, ws, client, args.tokens, args.rate, args.streams
                )
                client.close()
            finally:
                proc.terminate()
                proc.wait(60)
            bot.stop()
    server.stop()
    print(json.dumps(figures, ensure_ascii=False, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
