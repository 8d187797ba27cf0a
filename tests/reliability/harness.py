"""The reliability harness: Lucid run as the real processes it ships as, against the local fakes.

    with Stack(tmp, redis_url, feishu, bots=2, workers=2) as stack:      # `lucid bot` ×2, `lucid worker` ×2
        await stack.post(delivery, bot=0)                                 # one webhook POST, as Feishu sends it
        stack.kill_worker(0); stack.start_worker()                         # faults are real signals
        stack.wait_for(lambda: ..., timeout=60)

Every process is `python -m bot.cli …` with a `lucid.toml` and environment variables, exactly as an operator
runs it (README, "The `lucid` command"); nothing of the product is imported into those processes by the
tests, patched or mocked. Feishu and Ollama are the shared fakes (`tests.fakes`), reached over HTTP by the
real lark-oapi and ollama clients inside the product processes.

The helpers below read what a person could read afterwards: the Markdown files, the raw archive, the git
history, and the messages Feishu received (`FakeFeishu.sent`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from memory_core.lineformat import LineError, RawMessage, parse_file, parse_raw
from memory_core.namespace import Namespace, list_namespaces
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import TENANT_KEY, VERIFICATION_TOKEN, Delivery, deliver

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
KEY = "reliability-encrypt-key"
BOT = "ou_rel_bot_00000000000000000000000"
ADMIN = "ou_rel_admin_000000000000000000000"


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str | None) -> dict[str, str]:
    """The parent's environment without any Lucid/Redis setting of the developer's shell, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LUCID_", "REDIS_URL", "OLLAMA_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def lucid_cli(
    data: Path,
    *args: str,
    env: dict[str, str] | None = None,
    check: bool = True,
    stdin: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run `lucid <args> --data <data>` as a person would, in a clean environment (`clean_env()` unless
    `env`); with `check`, a non-zero exit fails the test with the command's stderr."""
    out = subprocess.run(
        [sys.executable, "-m", "bot.cli", *args, "--data", str(data)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        input=stdin,
        timeout=timeout,
    )
    if check:
        assert out.returncode == 0, (
            f"lucid {' '.join(args)[:200]}: exit {out.returncode}\n{out.stderr[-2000:]}"
        )
    return out


_BATCH_END = "\n--- lucid-batch-exit "
_BATCH = f"""
import json, sys
from bot.cli import main
for args in json.loads(sys.argv[1]):
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    for stream in (sys.stdout, sys.stderr):
        stream.write({_BATCH_END!r} + json.dumps(code) + "\\n")
        stream.flush()
"""


def lucid_cli_batch(
    data: Path,
    commands: Sequence[Sequence[str]],
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 300,
) -> list[subprocess.CompletedProcess[str]]:
    """Several `lucid <args> --data <data>` run one after the other by `lucid`'s entry point
    (`bot.cli:main`) in ONE process, each with its own runtime and output: for a test that reads with many
    commands, a process start-up per command was most of its time. Same environment and checks as
    `lucid_cli`; a command that raises fails the whole process, with its traceback."""
    runs = [[*args, "--data", str(data)] for args in commands]
    out = subprocess.run(
        [sys.executable, "-c", _BATCH, json.dumps(runs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        timeout=timeout,
    )
    assert out.returncode == 0, f"lucid batch: exit {out.returncode}\n{out.stderr[-2000:]}"
    outs, errs = out.stdout.split(_BATCH_END), out.stderr.split(_BATCH_END)
    assert len(outs) == len(errs) == len(runs) + 1, out.stderr[-2000:]
    done = []
    for i, args in enumerate(runs):
        code = json.loads(outs[i + 1].split("\n", 1)[0])
        text = outs[i] if i == 0 else outs[i].split("\n", 1)[1]
        err = errs[i] if i == 0 else errs[i].split("\n", 1)[1]
        done.append(subprocess.CompletedProcess(args, code, text, err))
        if check:
            assert code == 0, f"lucid {' '.join(args)[:200]}: exit {code}\n{err[-2000:]}"
    return done


def lucid_import(
    data: Path, rows: Sequence[Mapping[str, Any]], *args: str, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """`lucid import` of `rows` (written as JSON Lines beside the data directory), quietly."""
    source = data.parent / f"import-{uuid.uuid4().hex[:8]}.jsonl"
    source.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return lucid_cli(data, "import", str(source), "--quiet", *args, **kwargs)


def write_config(path: Path, personas: Sequence[str] = ("x", "y"), **extra: str) -> Path:
    """A `lucid.toml` with one Feishu app per persona (encrypted, signed events; fixed bot open_id)."""
    lines = []
    for name in personas:
        lines += [
            f"[personas.{name}]",
            f'app_id = "cli_rel{name}{abs(hash(str(path))) % 10**8:08d}"',
            'app_secret = "secret"',
            f'verification_token = "{VERIFICATION_TOKEN}"',
            f'encrypt_key = "{KEY}"',
            f'bot_open_id = "{BOT}"',
            f'admins = ["{ADMIN}"]',
        ]
        lines += [f'{k} = "{v}"' for k, v in extra.items()]
        lines.append("")
    path.write_text("\n".join(lines), "utf-8")
    return path


@dataclass
class Proc:
    role: str
    popen: subprocess.Popen[bytes]
    log: Path
    port: int | None = None
    replaced: bool = False

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


_LIVE: set[Any] = set()


@atexit.register
def _kill_leftovers() -> None:
    """A test run interrupted mid-test must not leave bots and workers running."""
    for stack in list(_LIVE):
        for proc in stack.procs:
            with contextlib.suppress(Exception):
                Stack.kill(proc)


@dataclass(eq=False)
class Stack:
    """`bots` webhook processes and `workers` worker processes on one Redis, one data dir, the fakes."""

    tmp: Path
    redis_url: str
    feishu: FakeFeishu
    bots: int = 2
    workers: int = 2
    ollama_url: str | None = None
    chat_model: str | None = None
    dream_model: str | None = None
    personas: Sequence[str] = ("x", "y")
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.data = self.tmp / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.logs = self.tmp / "logs"
        self.logs.mkdir(exist_ok=True)
        self.config = write_config(self.tmp / "lucid.toml", self.personas)
        self.client = redis.Redis.from_url(self.redis_url)

    # -- processes ---------------------------------------------------------------------------

    def env(self, **extra: str | None) -> dict[str, str]:
        return clean_env(
            REDIS_URL=self.redis_url,
            LUCID_DATA=str(self.data),
            LUCID_CONFIG=str(self.config),
            LUCID_FEISHU_DOMAIN=self.feishu.url,
            OLLAMA_HOST=self.ollama_url,
            LUCID_CHAT_MODEL=self.chat_model,
            LUCID_DREAM_MODEL=self.dream_model,
            LUCID_DREAM_LIGHT="off",
            LUCID_DREAM_DEEP="off",
            LUCID_DREAM_REPLAY="off",
            LUCID_DREAM_PROFILE="off",
            **self.extra_env,
            **extra,
        )

    def _spawn(self, role: str, args: list[str], port: int | None = None) -> Proc:
        n = sum(1 for p in self.procs if p.role == role)
        log = self.logs / f"{role}{n}.log"
        env = self.env(LUCID_PORT=str(port) if port else None)
        fh = log.open("ab")
        cmd = [PY, "-m", "bot.cli", "-v", *args]
        popen = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a SIGKILL takes a worker's work-horse too
        )
        fh.close()
        proc = Proc(role, popen, log, port)
        self.procs.append(proc)
        return proc

    def start_bot(self) -> Proc:
        proc = self._spawn("bot", ["bot", "--host", "127.0.0.1"], port=free_port())
        deadline = time.monotonic() + 60
        while True:
            assert proc.alive, proc.log.read_text(errors="replace")[-3000:]
            try:
                with socket.create_connection(("127.0.0.1", proc.port or 0), timeout=0.5):
                    break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"bot did not listen: {proc.log.read_text(errors='replace')[-2000:]}"
                    ) from exc
                time.sleep(0.1)
        return proc

    def start_worker(self) -> Proc:
        return self._spawn("worker", ["worker"])

    def start(self) -> Stack:
        for _ in range(self.workers):
            self.start_worker()
        for _ in range(self.bots):
            self.start_bot()
        self.wait_workers(self.workers)
        return self

    def wait_workers(self, n: int, timeout: float = 60.0) -> None:
        """Until `n` live workers are registered in Redis (imports done, listening on the queues)."""
        from rq import Worker

        def ready() -> bool:
            for proc in self.procs:
                assert proc.alive or proc.popen.returncode in (-9, -15, 0), proc.log.read_text(
                    errors="replace"
                )[-3000:]
            return len(Worker.all(connection=self.client)) >= n

        assert wait_for(ready, timeout), f"{len(Worker.all(connection=self.client))}/{n} workers up"

    def restart_dead_workers(self) -> int:
        """What docker compose's `restart: unless-stopped` does for a worker that exited on its own."""
        dead = [p for p in self.procs if p.role == "worker" and not p.alive and not p.replaced]
        for proc in dead:
            proc.replaced = True
            self.start_worker()
        return len(dead)

    @property
    def live_bots(self) -> list[Proc]:
        return [p for p in self.procs if p.role == "bot" and p.alive]

    @property
    def live_workers(self) -> list[Proc]:
        return [p for p in self.procs if p.role == "worker" and p.alive]

    @staticmethod
    def tree(proc: Proc) -> list[int]:
        """The process and every descendant. RQ's work-horse calls setsid(), so it is not in the worker's
        process group: a signal "to the worker" (as a container kill or the OOM killer delivers it to
        everything) must be sent to each process of the tree."""
        import psutil

        try:
            root = psutil.Process(proc.popen.pid)
            return [root.pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    @classmethod
    def kill(cls, proc: Proc, sig: int = signal.SIGKILL) -> list[int]:
        pids = cls.tree(proc)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=30)
        return pids

    def stop(self) -> None:
        """SIGTERM (RQ's warm shutdown, aiohttp's graceful stop), then SIGKILL whatever is left of any tree."""
        for proc in self.procs:
            if proc.alive:
                for pid in self.tree(proc):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)  # a paused one must be able to stop
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            self.kill(proc)  # no-op for those that exited; the work-horses and stragglers otherwise
        _LIVE.discard(self)
        self.client.close()

    def __enter__(self) -> Stack:
        _LIVE.add(self)
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs_text(self) -> str:
        return "\n".join(p.log.read_text(errors="replace") for p in self.procs if p.log.exists())

    # -- traffic -----------------------------------------------------------------------------

    async def post(
        self, session: aiohttp.ClientSession, delivery: Delivery, bot: int = 0, persona: str = "x"
    ) -> tuple[int, str, float]:
        """One POST to a bot process: (status, outcome message, seconds). Connection errors → status 0."""
        target = self.bots_by_index(bot)
        started = time.perf_counter()
        try:
            async with session.post(
                f"{target.url}/feishu/{persona}/events", data=delivery.body, headers=delivery.headers
            ) as resp:
                body = await resp.text()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return 0, type(exc).__name__, time.perf_counter() - started
        try:
            msg = str(json.loads(body).get("msg", ""))
        except ValueError:
            msg = body[:80]
        return status, msg, time.perf_counter() - started

    def bots_by_index(self, i: int) -> Proc:
        bots = [p for p in self.procs if p.role == "bot"]
        return bots[i % len(bots)]

    async def deliver_until_acked(
        self,
        session: aiohttp.ClientSession,
        event: dict[str, Any],
        bot: int = 0,
        persona: str = "x",
        patience: float = 120.0,
    ) -> list[tuple[int, str, float]]:
        """Feishu's retry behaviour: redeliver (new nonce and signature, another replica if one is down)
        until a 200, with backoff. Returns every attempt."""
        attempts = []
        deadline = time.monotonic() + patience
        delay = 0.2
        i = bot
        while True:
            bots = [p for p in self.procs if p.role == "bot"]
            live = [n for n, p in enumerate(bots) if p.alive]
            target = i % len(bots) if bots[i % len(bots)].alive or not live else live[i % len(live)]
            attempt = await self.post(session, deliver(event, encrypt_key=KEY), target, persona)
            attempts.append(attempt)
            if attempt[0] == 200 or time.monotonic() > deadline:
                return attempts
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 2.0)
            i += 1

    # -- waiting -----------------------------------------------------------------------------

    def backlog(self) -> dict[str, int]:
        """What is still to do in Redis: queued jobs, jobs a live worker is running, people's inboxes,
        pending writer ops. (A job whose worker was killed stays "started" in RQ's registry until a
        maintenance pass; it is not work anyone is doing.)"""
        from rq import Queue, Worker

        out: dict[str, int] = {}
        for name in ("chat", "memory"):
            out[f"{name}_queued"] = Queue(name, connection=self.client).count
        live = {p.popen.pid for p in self.procs if p.alive}  # a killed worker stays registered for minutes
        out["running"] = sum(
            1 for w in Worker.all(connection=self.client) if w.pid in live and w.get_current_job_id()
        )
        out["inbox"] = sum(int(self.client.zcard(k)) for k in self.client.scan_iter("lucid:inbox:*"))
        out["ops"] = sum(int(self.client.llen(k)) for k in self.client.scan_iter("lucid:ops:*"))
        return out

    def settle(self, timeout: float = 120.0) -> dict[str, int]:
        """Wait until nothing is queued, running, in an inbox or pending for a writer."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.backlog()
            if not any(left.values()):
                return left
            if time.monotonic() > deadline:
                return left
            time.sleep(0.2)


def wait_for(predicate: Callable[[], bool], timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


async def await_for(predicate: Callable[[], bool], timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(poll)
    return True


# -- what a person can read afterwards ---------------------------------------------------------


def replies_by_parent(feishu: FakeFeishu) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = defaultdict(list)
    for m in list(feishu.sent):
        if m.parent_id:
            out[m.parent_id].append(m)
    return out


def reply_requests_by_parent(feishu: FakeFeishu) -> Counter[str]:
    """How many reply requests each inbound message got (retries of one send share the uuid)."""
    out: Counter[str] = Counter()
    for call in list(feishu.requests):
        if call.endpoint == "reply":
            out[call.path.split("/")[-2]] += 1
    return out


def ns_for(union_id: str, persona: str = "x", tenant: str = TENANT_KEY) -> Namespace:
    return Namespace.of(tenant, union_id, persona)


def raw_messages(root: Path) -> list[RawMessage]:
    """Every line of a namespace's raw archive, parsed; a line that does not parse fails the test."""
    out = []
    for day in sorted((root / "raw").glob("*.md")):
        for line in day.read_text("utf-8").splitlines():
            if line.startswith("- "):
                try:
                    out.append(parse_raw(line))
                except LineError as exc:
                    raise AssertionError(f"unreadable raw line in {day}: {line[:200]!r} ({exc})") from exc
    return out


def memory_entries(root: Path) -> tuple[list[Any], list[Any], list[tuple[str, str]]]:
    """(MEMORY.md entries, ARCHIVE.md entries, problems of both)."""
    entries, archived, problems = [], [], []
    for name, bucket in (("MEMORY.md", entries), ("ARCHIVE.md", archived)):
        path = root / name
        if path.exists():
            doc = parse_file(path.read_text("utf-8"))
            bucket.extend(doc.entries())
            problems.extend(doc.problems())
    return entries, archived, problems


def all_namespaces(data: Path) -> list[Namespace]:
    return list_namespaces(data)


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, errors="replace", check=False
    ).stdout


def git_everything(root: Path) -> str:
    """Every byte git keeps for a namespace: every commit's patch, every object (loose or packed),
    every blob reachable or not, the reflog — what `git cat-file` can still show."""
    parts = [git(root, "log", "-p", "--all", "--reflog", "--format=%H %s%n%b")]
    objects = git(root, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)")
    names = [line.split()[0] for line in objects.splitlines() if line.endswith(("blob", "commit", "tag"))]
    if names:
        batch = subprocess.run(
            ["git", "-C", str(root), "cat-file", "--batch"],
            input="\n".join(names) + "\n",
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
        )
        parts.append(batch.stdout)
    return "\n".join(parts)


def files_text(root: Path, skip_git: bool = True) -> Iterator[tuple[Path, str]]:
    for path in sorted(root.rglob("*")):
        if not path.is_file() or (skip_git and ".git" in path.relative_to(root).parts):
            continue
        yield path, path.read_bytes().decode("utf-8", errors="replace")


def percentiles(values: Iterable[float], scale: float = 1000.0) -> dict[str, float]:
    data = sorted(v * scale for v in values)
    if not data:
        return {}

    def at(q: float) -> float:
        return round(data[min(len(data) - 1, int(q * len(data)))], 1)

    return {
        "n": len(data),
        "p50": at(0.50),
        "p95": at(0.95),
        "p99": at(0.99),
        "max": round(data[-1], 1),
        "mean": round(statistics.fmean(data), 1),
    }


MARK = re.compile(r"MARK-[0-9a-f]{12}")


# -- a day of traffic ---------------------------------------------------------------------------

DISTRICTS = (
    "余杭区",
    "西湖区",
    "滨江区",
    "拱墅区",
    "上城区",
    "萧山区",
    "临平区",
    "钱塘区",
    "富阳区",
    "临安区",
)
CHITCHAT = ("你好", "谢谢", "今天天气不错", "哈哈", "早上好")


@dataclass
class Msg:
    """One message a person sends, what it should leave behind, and how Feishu delivers it."""

    index: int
    event: dict[str, Any]
    sender: Any  # tests.fakes.feishu_events.User
    chat_id: str
    group: bool
    kind: str  # fact, place, question, chitchat, command
    text: str
    fact: str | None = None  # the text memory must hold afterwards (fact / place)
    expect_place: str | None = None  # for a private "我在哪": the district it must answer
    deliveries: list[tuple[int, str]] = field(default_factory=list)  # (bot, "now" | "later") per delivery

    @property
    def message_id(self) -> str:
        return str(self.event["event"]["message"]["message_id"])

    @property
    def created(self) -> int:
        return int(self.event["event"]["message"]["create_time"])


def random_fact(rng: Any) -> str:
    """Twelve random common CJK characters: no two facts of a person are near duplicates, none has a
    subject (so none supersedes another), none looks like a secret."""
    from memory_core.intents import parse_intent
    from memory_core.secretscan import contains_secret
    from memory_core.subjects import recognise

    while True:
        text = "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(12))
        intent = parse_intent("记住" + text)
        if (
            intent.kind == "remember"
            and intent.text == text
            and recognise(text) is None
            and not contains_secret(text)
        ):
            return text


def traffic(
    n: int,
    *,
    users: int = 200,
    groups: int = 20,
    seed: int = 20261130,
    retry_share: float = 0.20,
    both_share: float = 0.05,
    start_ms: int | None = None,
) -> list[Msg]:
    """`n` messages from `users` people over `groups` groups (each person in two) and their private chats.

    The order interleaves people (one message per person per round, rounds shuffled), so the messages of
    one person are far apart in the stream, as they are in life. Kinds: 45 % `记住…` facts, 10 % `我住在…`
    (supersedes), 15 % `我在哪`, 20 % chit-chat, 10 % `/memory`; 70 % in the private chat, 30 % in a group
    with an @mention. `retry_share` of the messages are delivered a second time later (Feishu's retry,
    new nonce and signature), `both_share` to both bot processes at once.
    """
    import random

    from tests.fakes.feishu_events import group_mention_event, message_event, p2p_chat_id, user

    rng = random.Random(seed)
    people = [user(f"rel-user-{i:03d}") for i in range(users)]
    chats = [f"oc_relgroup{g:02d}{'0' * 20}" for g in range(groups)]
    member = {p.union_id: rng.sample(chats, 2) for p in people}
    clock = start_ms if start_ms is not None else int(time.time() * 1000)
    place: dict[str, str] = {}
    out: list[Msg] = []
    order: list[Any] = []
    while len(order) < n:
        batch = list(people)
        rng.shuffle(batch)
        order.extend(batch)
    for i, who in enumerate(order[:n]):
        clock += 1
        group = rng.random() < 0.30
        chat = rng.choice(member[who.union_id]) if group else p2p_chat_id(who)
        r = rng.random()
        fact = expect = None
        if r < 0.45:
            kind, fact = "fact", random_fact(rng)
            text = "记住" + fact
        elif r < 0.55:
            kind = "place"
            district = rng.choice(DISTRICTS)
            text = fact = f"我住在{district}"
            place[who.union_id] = district
        elif r < 0.70:
            kind, text = "question", "我在哪"
            expect = None if group else place.get(who.union_id)
        elif r < 0.90:
            kind, text = "chitchat", rng.choice(CHITCHAT)
        else:
            kind, text = "command", "/memory"
        if group:
            event = group_mention_event(text, bot_open_id=BOT, sender=who, chat_id=chat, create_time_ms=clock)
        else:
            event = message_event(text, sender=who, create_time_ms=clock)
        msg = Msg(i, event, who, chat, group, kind, text, fact, expect)
        first = rng.randrange(2)
        msg.deliveries = [(first, "now")]
        if rng.random() < both_share:  # both replicas at the same moment
            msg.deliveries.append((1 - first, "now"))
        if rng.random() < retry_share:  # Feishu's retry, a little later
            msg.deliveries.append((rng.randrange(2), "later"))
        out.append(msg)
    return out


# -- conversations -------------------------------------------------------------------------------

EXTRACT_PREFIX = "You pick out durable facts"


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return str(message.get("content") or "")
    return ""


def chat_responder(slow_once: Sequence[str] = (), delay: float = 60.0) -> Callable[[dict[str, Any]], Any]:
    """A chat model that answers at once (`好的（模型）：<the message>`), says NONE to extraction, and
    holds its first answer to a message containing one of `slow_once` for `delay` seconds."""
    from tests.fakes.ollama import Delay

    held: set[str] = set()

    def respond(body: dict[str, Any]) -> Any:
        system = str((body.get("messages") or [{}])[0].get("content") or "")
        if system.startswith(EXTRACT_PREFIX):
            return "NONE"
        if '"merges"' in system:
            return '{"merges": []}'
        text = last_user_text(body)
        reply = f"好的（模型）：{text[:60]}"
        for word in slow_once:
            if word in text and text not in held:
                held.add(text)
                return Delay(delay, reply)
        return reply

    return respond


async def converse(
    stack: Stack,
    events: Sequence[dict[str, Any]],
    *,
    persona: str = "x",
    concurrency: int = 1,
    bot: int = 0,
    pace: float = 0.0,
) -> list[list[tuple[int, str, float]]]:
    """Deliver `events` in order (Feishu's retries included), the i-th not before i × `pace` seconds,
    and return every attempt of each."""
    out: list[list[tuple[int, str, float]]] = [[] for _ in events]
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:

        async def one(i: int, event: dict[str, Any]) -> None:
            await asyncio.sleep(i * pace)
            async with sem:
                out[i] = await stack.deliver_until_acked(session, event, bot + i, persona)

        await asyncio.gather(*(one(i, e) for i, e in enumerate(events)))
    return out


def ids_of(events: Iterable[dict[str, Any]]) -> list[str]:
    return [str(e["event"]["message"]["message_id"]) for e in events]


def text_of(message: Any) -> str:
    """What a person reads in a sent message: the text of a `text` message, or every text node of a `post`
    (Markdown replies go out as `post`), or of an `interactive` card (its markdown `content` strings: the
    `/memory` card lists the entries there)."""
    body = message.body

    def walk(node: Any) -> list[str]:
        if isinstance(node, dict):
            out = [node[k] for k in ("text", "content") if isinstance(node.get(k), str)]
            for key, value in node.items():
                if key not in ("text", "content") or not isinstance(value, str):
                    out += walk(value)
            return out
        if isinstance(node, list):
            return [t for item in node for t in walk(item)]
        return []

    return "\n".join(walk(body))


def reply_text(feishu: FakeFeishu, message_id: str) -> str:
    return "\n".join(text_of(m) for m in replies_by_parent(feishu).get(message_id, []))


class ByText:
    """A FakeOllama responder scripted per message: the turn's model calls for a message (the last user
    message of the request) take that message's replies in order, then `default`. Extraction requests
    (the background job after a turn) get NONE, so they never take a reply meant for a turn."""

    def __init__(self, default: Any = "好的。", extraction: Any = "NONE") -> None:
        import threading

        self.default = default
        self.extraction = extraction
        self.replies: dict[str, list[Any]] = {}
        self.extractions: dict[str, Any] = {}  # words of the message → extraction's answer for it
        self.lock = threading.Lock()

    def add(self, text: str, *replies: Any) -> None:
        with self.lock:
            self.replies.setdefault(text, []).extend(replies)

    @property
    def pending(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.replies.values())

    def __call__(self, body: dict[str, Any]) -> Any:
        system = str((body.get("messages") or [{}])[0].get("content") or "")
        if system.startswith(EXTRACT_PREFIX):
            asked = last_user_text(body)
            with self.lock:
                found = next((a for key, a in self.extractions.items() if key in asked), None)
            return found if found is not None else self.extraction
        with self.lock:
            queue = self.replies.get(last_user_text(body))
            return queue.pop(0) if queue else self.default


def log_mark(stack: Stack) -> dict[Path, int]:
    """Where each process log ends now (a shared stack's logs hold earlier tests too)."""
    return {p.log: p.log.stat().st_size for p in stack.procs if p.log.exists()}


def logs_since(stack: Stack, mark: dict[Path, int]) -> str:
    out = []
    for p in stack.procs:
        if p.log.exists():
            with p.log.open("rb") as fh:
                fh.seek(mark.get(p.log, 0))
                out.append(fh.read().decode(errors="replace"))
    return "\n".join(out)


def on_small_tmpfs(tmp_path: Path, script: str, filler_bytes: int, timeout: float = 300) -> dict[str, Any]:
    """Run `script` (Python source, given the mount point as argv[1]) in a private mount namespace on a
    1.5 MB tmpfs already holding `filler_bytes`, so it runs into ENOSPC; its last stdout line, as JSON."""
    import shutil

    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("needs util-linux's `unshare` to mount a private tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    path = tmp_path / "script.py"
    path.write_text(script)
    inner = (
        f"mount -t tmpfs -o size=1500k tmpfs {mnt} && "
        f"head -c {filler_bytes} /dev/zero > {mnt}/filler && "
        f"{sys.executable} {path} {mnt}"
    )
    args = [unshare, "--mount", "--propagation", "private"]
    if os.getuid() != 0:
        args.insert(1, "--map-root-user")
    out = subprocess.run(
        [*args, "sh", "-c", inner],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
