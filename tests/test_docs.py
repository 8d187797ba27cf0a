"""Every `lucid` command and every setting is documented (README, .env.example) and has --help."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from bot.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text("utf-8")
ENV_EXAMPLE = (ROOT / ".env.example").read_text("utf-8")


_HELP_OF_EACH = """
import contextlib, io, json, sys, traceback
from bot.cli import main
for name in sys.argv[1:]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = main([name, "--help"])
    except SystemExit as exc:
        code = exc.code
    except Exception:
        code, out = "crashed", io.StringIO(traceback.format_exc())
    print(json.dumps([name, [code, out.getvalue()]]))
"""


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(sub.choices)  # type: ignore[union-attr]


def _settings_in_code() -> set[str]:
    names: set[str] = set()
    for path in list((ROOT / "workers").glob("*.py")) + list((ROOT / "bot").glob("*.py")):
        names |= set(
            re.findall(
                r"[\"'](LUCID_[A-Z0-9_]+|REDIS_URL|OLLAMA_HOST|REDIS_SERVER_BIN)[\"']",
                path.read_text("utf-8"),
            )
        )
    return names


def test_every_command_is_in_the_readme_and_has_help() -> None:
    commands = _commands()
    assert {
        "remember",
        "recall",
        "search",
        "import",
        "show",
        "forget",
        "pin",
        "dream",
        "history",
        "undo",
        "doctor",
        "serve",
        "worker",
        "cron",
        "chat",
        "demo",
    } <= set(commands)
    for name in commands:
        assert f"lucid {name}" in README, f"`lucid {name}` is not documented in the README"
    # One process asks `lucid`'s entry point (`bot.cli:main`, the console script) for every command's help:
    # a process per command paid the start-up ~20 times.
    out = subprocess.run(
        [sys.executable, "-c", _HELP_OF_EACH, *commands],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    helps = dict(json.loads(line) for line in out.stdout.splitlines())
    assert sorted(helps) == commands
    for name, (code, text) in helps.items():
        assert code == 0 and f"usage: lucid {name}" in text, (name, code, text[-2000:])


def test_every_setting_is_documented() -> None:
    settings = _settings_in_code()
    assert {"LUCID_DATA", "REDIS_URL", "LUCID_CHAT_MODEL", "LUCID_VAULT_KEY", "LUCID_ADMIN_TOKEN"} <= settings
    for name in settings:
        assert f"`{name}`" in README, f"{name} is not in the README's configuration table"
        assert name in ENV_EXAMPLE, f"{name} is not in .env.example"
