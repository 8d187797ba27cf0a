"""Memory off, when the person says so (HexClaw §10, with its one-path-ignores-it bug closed)."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import redis

from .redis_backend import text
from .redis_keys import Keys

_PER_MESSAGE = re.compile(
    r"^\s*[/／]nomem\b[\s:：,，]*"
    r"|[，,。.!！;；\s]*(?:这句话?|这条|这个)(?:别|不要|不用)记(?:住|下来|下)?(?:了|哦|啊)?[。.!！]?"
    r"|[，,。.!！;；\s]*(?:别|不要)记(?:住)?这(?:句话?|条)[。.!！]?"
    r"|[,.;!\s]*(?:please\s+)?(?:don'?t|do not)\s+remember\s+(?:this|that)(?:\s+one)?[.!]?"
    r"|[,.;!\s]*\boff the record\b[,.:!]?",
    re.I,
)


def per_message_off(message: str) -> tuple[bool, str]:
    """(off, the message without its switch). `/nomem 我今天很累` → (True, "我今天很累")."""
    cleaned, n = _PER_MESSAGE.subn(" ", message)
    if not n:
        return False, message
    return True, " ".join(cleaned.split()).strip(" :：,，。.;；")


@dataclass(frozen=True)
class ChatState:
    off: bool
    generation: int


@dataclass(frozen=True)
class TurnMemory:
    """What one turn may do with memory: `quiet` is the per-message switch, `chat_off` the per-chat one
    as the turn started, `generation` the chat switch's generation then (background work re-checks it)."""

    quiet: bool = False
    chat_off: bool = False
    generation: int = 0

    @property
    def reads(self) -> bool:
        return not self.quiet

    @property
    def learns(self) -> bool:
        return not self.quiet and not self.chat_off


class ChatSwitch:
    """The per-message and per-chat switches (docs/PRIVACY.md, "Memory off"), in Redis or in this instance;
    a flip bumps a generation that background work re-checks before it writes (`learning`)."""

    def __init__(self, client: redis.Redis | None) -> None:
        self.client = client
        self._local: dict[str, ChatState] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(tenant: str, persona: str, chat: str) -> str:
        return Keys.memory_off(tenant, persona, chat)

    def state(self, tenant: str, persona: str, chat: str) -> ChatState:
        key = self.key(tenant, persona, chat)
        if self.client is None:
            with self._lock:
                return self._local.get(key, ChatState(False, 0))
        off, gen = self.client.mget(key, key + ":gen")
        return ChatState(off is not None and text(off) == "1", int(text(gen)) if gen else 0)

    def turn(self, tenant: str, persona: str, chat: str, off: bool) -> ChatState:
        """Flip the switch; the generation moves on every flip, so in-flight work sees it changed."""
        key = self.key(tenant, persona, chat)
        if self.client is None:
            with self._lock:
                old = self._local.get(key, ChatState(False, 0))
                self._local[key] = ChatState(off, old.generation + 1)
                return self._local[key]
        pipe = self.client.pipeline()
        pipe.incr(key + ":gen")
        if off:
            pipe.set(key, "1")
        else:
            pipe.delete(key)
        gen = pipe.execute()[0]
        return ChatState(off, int(gen))

    def learning(self, tenant: str, persona: str, chat: str, since: int | None = None) -> bool:
        """May what was said in `chat` be learned now? With `since` (the generation captured when the work
        started), also no flip may have happened in between."""
        state = self.state(tenant, persona, chat)
        return not state.off and (since is None or state.generation == since)
