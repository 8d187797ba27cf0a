"""The trust suite's helpers: drive Lucid as a person does and read what a person would see.

`lucid` runs the real CLI in-process (`bot.cli.main`, the same code as the `lucid` command, with the
clock pinned through LUCID_NOW and moved one minute per command, so "what is current" is exact). It
reads MEMORY.md and ARCHIVE.md from disk. `turn_runtime` builds the real turn against a real Redis and the
FakeOllama server, for paths where a model acts (the `manage_memory` tool, extraction, replay).

Scenario modules are named per class (test_supersede.py, test_rewording.py, …); bench/trust.py reports the
pass count per module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from bot.cli import main
from memory_core.lineformat import format_time
from memory_core.namespace import Namespace
from tests.fakes.ollama import FakeOllama
from tests.trust.turns import MODEL, make_runtime, tool
from workers.runtime import Runtime

START = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
__all__ = ["MODEL", "tool"]  # imported from here by the scenario modules


class Lucid:
    """One person's memory, driven through the `lucid` CLI. Every command runs one minute after the last."""

    def __init__(self, data: Path, capsys: pytest.CaptureFixture[str], user: str = "default") -> None:
        self.data, self.capsys, self.user = data, capsys, user
        self.now = START

    # -- running
    def run(self, *args: str, ok: bool = True) -> str:
        self.now += timedelta(minutes=1)
        os.environ["LUCID_NOW"] = format_time(self.now)
        self.capsys.readouterr()
        code = main([*args, "--data", str(self.data), "--user", self.user])
        out = self.capsys.readouterr()
        if ok:
            assert code == 0, f"lucid {' '.join(args)}: exit {code}\n{out.err}"
        return out.out

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json"))

    def remember(self, text: str, *extra: str) -> dict[str, Any]:
        """`lucid remember TEXT` → the outcome (status, id, superseded)."""
        out: dict[str, Any] = self.json("remember", text, *extra)
        return out

    def forget(self, ident: str) -> dict[str, Any]:
        out: dict[str, Any] = self.json("forget", ident)
        return out

    # -- reading
    def current(self) -> list[str]:
        """The texts `lucid show` lists as current, in file order."""
        return [r["text"] for r in self.json("show")["results"] if r.get("current", True)]

    def everything(self) -> list[dict[str, Any]]:
        """Every entry `lucid show --all` knows: current, superseded and archived."""
        rows: list[dict[str, Any]] = self.json("show", "--all")["results"]
        return rows

    def history(self) -> list[str]:
        """Texts that are kept but no longer current (superseded or archived)."""
        return [r["text"] for r in self.everything() if not r["current"]]

    def recall(self, query: str, k: int = 5) -> list[str]:
        return [r["text"] for r in self.json("recall", query, "--k", str(k))["results"]]

    @property
    def folder(self) -> Path:
        return self.data / "default" / self.user / "default"

    def memory_md(self) -> str:
        return (self.folder / "MEMORY.md").read_text("utf-8")

    def archive_md(self) -> str:
        path = self.folder / "ARCHIVE.md"
        return path.read_text("utf-8") if path.exists() else ""

    def line_of(self, text: str) -> str:
        """The MEMORY.md line holding `text` (struck through when superseded)."""
        hits = [ln for ln in self.memory_md().splitlines() if ln.startswith("- ") and text in ln]
        assert hits, f"{text!r} is not in MEMORY.md"
        return hits[0]

    def entry(self, text: str) -> dict[str, Any]:
        rows = [r for r in self.everything() if r["text"] == text]
        assert len(rows) == 1, f"{text!r}: {len(rows)} entries"
        return rows[0]


@pytest.fixture
def lucid(data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Lucid:
    """The CLI on a fresh data directory, with no LUCID_* or REDIS_URL from the caller's environment."""
    for key in list(os.environ):
        if key.startswith("LUCID_") or key == "REDIS_URL":
            monkeypatch.delenv(key)
    monkeypatch.setenv("LUCID_NOW", format_time(START))  # restored after the test
    return Lucid(data_dir, capsys)


def says(lucid: Lucid, *texts: str) -> list[str]:
    """Remember each text in turn; the statuses, in order."""
    return [str(lucid.remember(t)["status"]) for t in texts]


# ------------------------------------------------------------------------------------------ the turn


@pytest.fixture
def ollama(request: pytest.FixtureRequest) -> Iterator[FakeOllama]:
    """FakeOllama; what it answers unscripted is the module's `OLLAMA_REPLY` (none: HTTP 500)."""
    with FakeOllama(default_reply=getattr(request.module, "OLLAMA_REPLY", None)) as fake:
        yield fake


@pytest.fixture
def rt(data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama) -> Runtime:
    """A chat runtime with git history (forget and purge tests read it); a module may define its own."""
    return make_runtime(data_dir, redis_url, ollama=ollama, git=True)


def turn_runtime(data_dir: Path, redis_url: str, ollama: FakeOllama | None = None) -> Runtime:
    """The runtime a chat turn uses: real Redis, real files, the real ollama client against FakeOllama."""
    return make_runtime(data_dir, redis_url, ollama=ollama, timeout=2.0, dream_model=None)


def ns_memory(runtime: Runtime, ns: Namespace) -> str:
    path = runtime.store.path(ns) / "MEMORY.md"
    return path.read_text("utf-8") if path.exists() else ""


@pytest.fixture
def fresh_redis(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


@pytest.fixture
def cli(
    data_dir: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str]]:
    """`lucid <command> --data <the test's data dir> …` in-process, on the suite's Redis, no model: (exit
    code, what it printed)."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    for name in ("LUCID_CHAT_MODEL", "LUCID_DREAM_MODEL", "LUCID_EMBED_MODEL"):
        monkeypatch.delenv(name, raising=False)

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main([args[0], "--data", str(data_dir), *args[1:]])
        return code, capsys.readouterr().out

    return run
