"""`lucid chat`: talk to a persona in the terminal through the very turn a Feishu message gets (`run`)."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from typing import Any, TextIO

from workers.inbound import Inbound
from workers.runtime import Runtime

EXIT = frozenset({"/quit", "/exit", "/q", "退出"})


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `chat` (with its own --data/--user/--persona/--tenant/--json; no `_common` needed)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "chat", help="chat in the terminal through the same turn pipeline (no Feishu needed)"
    )
    p.add_argument("--data", help="data directory (default: $LUCID_DATA or ./lucid-data)")
    p.add_argument("--user", default="default", help="user id (default: default)")
    p.add_argument("--persona", default="default", help="persona (default: default)")
    p.add_argument("--tenant", default="default", help="tenant (default: default)")
    p.add_argument("--open-id", help="the open_id to speak as (admin commands check it; default: --user)")
    p.add_argument("--group", metavar="CHAT_ID", help="speak in this group chat (group memory scope)")
    p.add_argument("--json", action="store_true", help="one JSON object per reply")
    return p


def run(
    args: argparse.Namespace, runtime: Runtime, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    """Each line read is one message: it goes through `workers.turn.run_turn` (commands, the raw archive, memory,
    the model or memory-only mode), and the reply is printed; interactive or piped."""
    from workers.turn import run_turn  # the turn pulls in lark-oapi: only load it when chatting

    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    interactive = stdin.isatty() and stdout.isatty() and not args.json
    chat_type, chat_id = ("group", args.group) if args.group else ("p2p", f"cli-{args.user}")
    if interactive:
        persona = runtime.settings.personas.get(args.persona)
        model = (persona.chat_model if persona else None) or runtime.settings.chat_model
        print(
            f"lucid chat · persona {args.persona} · {model or 'memory-only (no chat model)'} · /help, /quit",
            file=stdout,
        )
    while True:
        if interactive:
            stdout.write("you> ")
            stdout.flush()
        line = stdin.readline()
        if not line:
            break
        text = line.strip()
        if not text:
            continue
        if text in EXIT:
            break
        inbound = Inbound(
            tenant=args.tenant,
            user=args.user,
            open_id=args.open_id or args.user,
            persona=args.persona,
            chat_id=chat_id,
            chat_type=chat_type,
            message_id=f"cli-{secrets.token_hex(8)}",
            text=text,
            mentioned_bot=True,
            create_time=int(time.time() * 1000),
        )
        replies: list[str] = []
        result = run_turn(runtime, inbound, replies.append)
        if args.json:
            data = {
                "message_id": inbound.message_id,
                "reply": result.reply,
                "mode": result.mode,
                "outcomes": [o.to_json() for o in result.outcomes],
                "recalled": result.recalled,
            }
            print(json.dumps(data, ensure_ascii=False), file=stdout)
        else:
            print(("lucid> " if interactive else "") + "\n".join(replies), file=stdout)
        stdout.flush()
    return 0
