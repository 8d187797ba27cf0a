"""Every `lucid` command and every setting is documented (README, .env.example) and has --help."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bot.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text("utf-8")
ENV_EXAMPLE = (ROOT / ".env.example").read_text("utf-8")


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
        out = subprocess.run(
            [sys.executable, "-m", "bot.cli", name, "--help"], cwd=ROOT, capture_output=True, text=True
        )
        assert out.returncode == 0 and "usage: lucid" in out.stdout, name


def test_every_setting_is_documented() -> None:
    settings = _settings_in_code()
    assert {"LUCID_DATA", "REDIS_URL", "LUCID_CHAT_MODEL", "LUCID_VAULT_KEY", "LUCID_ADMIN_TOKEN"} <= settings
    for name in settings:
        assert f"`{name}`" in README, f"{name} is not in the README's configuration table"
        assert name in ENV_EXAMPLE, f"{name} is not in .env.example"
