"""What the trust-history scenarios share: the real `lucid` command in-process, with a pinned clock.

Every scenario drives `bot.cli.main` exactly as a person types it (`--data`, `--user`, `LUCID_NOW`), and
reads back what a person would look at: MEMORY.md, ARCHIVE.md, DREAMS.md, `lucid show/recall/history`.
A dream model, where one is needed, is the `ollama` client talking HTTP to tests/fakes/ollama.py.
(TODO: move into tests/trust/conftest.py once trust-write's scaffolding is on main.)
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from memory_core.lineformat import format_time, parse_file
from tests.fakes.ollama import FakeOllama

T0 = datetime(2026, 6, 20, 9, 0, tzinfo=UTC)
MODEL = "qwen3:4b"


def at(days: float) -> str:
    """T0 moved by `days` (negative: the past), as ISO text."""
    return format_time(T0 + timedelta(days=days))


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class Lucid:
    """`lucid …` for one person (tenant/user/persona) in one data directory, at a pinned time."""

    data: Path
    user: str = "alice"
    persona: str = "default"
    tenant: str = "default"
    now: str = field(default_factory=lambda: at(0))
    env: dict[str, str] = field(default_factory=dict)

    def __call__(self, *args: str, now: str | None = None, ns: bool = True) -> Ran:
        argv = [*args, "--data", str(self.data)]
        if ns:
            argv += ["--user", self.user, "--persona", self.persona, "--tenant", self.tenant]
        return self.run(argv, now)

    def run(self, argv: list[str], now: str | None = None) -> Ran:
        saved = dict(os.environ)
        for key in [k for k in os.environ if k.startswith(("LUCID_", "OLLAMA_", "REDIS_URL"))]:
            del os.environ[key]
        os.environ.update({"LUCID_NOW": now or self.now, **self.env})
        out, err = StringIO(), StringIO()
        try:
            with redirect_stdout(out), redirect_stderr(err):
                code = main(argv)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return Ran(code, out.getvalue(), err.getvalue())

    def ok(self, *args: str, now: str | None = None) -> Ran:
        ran = self(*args, now=now)
        assert ran.code == 0, ran.err
        return ran

    def run_printed(self, command: str, now: str | None = None) -> Ran:
        """Run a command exactly as the product printed it (`lucid …`)."""
        words = shlex.split(command)
        assert words[0] == "lucid", command
        return self.run(words[1:], now)

    # ------------------------------------------------------------------ what a person looks at

    @property
    def root(self) -> Path:
        return self.data / self.tenant / self.user / self.persona

    def read(self, name: str) -> str:
        path = self.root / name
        return path.read_text("utf-8") if path.exists() else ""

    def write(self, name: str, text: str) -> None:
        (self.root / name).write_text(text, "utf-8")

    def current_texts(self, now: str | None = None) -> list[str]:
        shown = self.ok("show", "--json", now=now).json()
        return [r["text"] for r in shown["results"] if r["current"]]

    def archived_texts(self) -> list[str]:
        text = self.read("ARCHIVE.md")
        return [e.text for e in parse_file(text).entries()] if text else []

    def entry(self, text: str) -> dict[str, Any]:
        shown = self.ok("show", "--all", "--json").json()
        [found] = [r for r in shown["results"] if r["text"] == text]
        return dict(found)

    def line_of(self, text: str) -> str:
        [line] = [ln for ln in self.read("MEMORY.md").splitlines() if f"- {text} <!--" in ln]
        return line

    def recall(self, query: str, *extra: str, now: str | None = None) -> list[str]:
        found = self.ok("recall", query, "--json", *extra, now=now).json()
        return [r["text"] for r in found["results"]]

    def history(self) -> list[dict[str, str]]:
        return list(self.ok("history", "--json").json()["results"])

    def import_lines(self, rows: list[dict[str, Any]], *flags: str, now: str | None = None) -> Ran:
        path = self.data.parent / f"import-{len(os.listdir(self.data.parent))}.jsonl"
        path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", "utf-8")
        return self.ok("import", str(path), "--quiet", *flags, now=now)

    def with_model(self, fake: FakeOllama) -> Lucid:
        self.env.update(OLLAMA_HOST=fake.url, LUCID_DREAM_MODEL=MODEL)
        return self


@pytest.fixture(name="lucid")
def lucid_fixture(tmp_path: Path) -> Lucid:
    data = tmp_path / "data"
    data.mkdir()
    return Lucid(data)


@pytest.fixture(name="fake")
def fake_fixture() -> Iterator[FakeOllama]:
    with FakeOllama() as server:
        yield server


def fact(ident: str, text: str, **fields: Any) -> dict[str, Any]:
    """One `lucid import` fact line."""
    return {"kind": "fact", "id": ident, "text": text, **fields}
