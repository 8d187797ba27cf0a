"""Short-lived conversation state: the session id, recent turns for the model, the language, flags.

Two implementations of one interface, chosen once by the wiring: in Redis when there is one (every worker
sees the same), else in this process (the terminal chat). Message text kept here is redacted first.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import redis

from memory_core.secretscan import redact

from .redis_keys import Keys

SESSION_TTL = 30 * 60
LANGUAGE_TTL = 30 * 86400  # a conversation's language outlives its sessions


def _pair(user: str, assistant: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": redact(user)}, {"role": "assistant", "content": redact(assistant)}]


class RedisScratch:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def session(self, key: str, candidate: str) -> str:
        """The chat's session id: kept while messages come within 30 minutes of each other."""
        full = Keys.session(key)
        pipe = self.client.pipeline()
        pipe.set(full, candidate, nx=True, ex=SESSION_TTL)
        pipe.get(full)
        pipe.expire(full, SESSION_TTL)
        value = pipe.execute()[1]
        return value.decode() if isinstance(value, bytes) else str(value or candidate)

    def history(self, key: str) -> list[dict[str, str]]:
        raw = self.client.lrange(Keys.history(key), 0, -1)
        return [json.loads(r) for r in reversed(raw)]

    def add_history(self, key: str, user: str, assistant: str, turns: int) -> None:
        full = Keys.history(key)
        pipe = self.client.pipeline()
        pipe.lpush(full, *[json.dumps(m, ensure_ascii=False) for m in _pair(user, assistant)])
        pipe.ltrim(full, 0, 2 * turns - 1)
        pipe.expire(full, SESSION_TTL)
        pipe.execute()

    def drop_history(self, key: str) -> None:
        self.client.delete(Keys.history(key))

    def language(self, key: str) -> str | None:
        value = self.client.get(Keys.language(key))
        return value.decode() if isinstance(value, bytes) else value

    def set_language(self, key: str, lang: str) -> None:
        full = Keys.language(key)
        if self.client.get(full) != lang.encode():
            self.client.set(full, lang, ex=LANGUAGE_TTL)

    def flag(self, name: str, ttl: float) -> None:
        self.client.set(Keys.flag(name), "1", px=max(1, int(ttl * 1000)))

    def flagged(self, name: str) -> bool:
        return bool(self.client.exists(Keys.flag(name)))


class LocalScratch:
    """The same, in this process only (no Redis): values expire as the Redis keys would."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def _get(self, key: str) -> Any:
        with self._lock:
            held = self._held.get(key)
            return held[1] if held and held[0] > time.monotonic() else None

    def _set(self, key: str, value: Any, ttl: float) -> None:
        with self._lock:
            self._held[key] = (time.monotonic() + ttl, value)

    def session(self, key: str, candidate: str) -> str:
        value = str(self._get(f"session:{key}") or candidate)
        self._set(f"session:{key}", value, SESSION_TTL)
        return value

    def history(self, key: str) -> list[dict[str, str]]:
        return list(self._get(f"history:{key}") or [])

    def add_history(self, key: str, user: str, assistant: str, turns: int) -> None:
        kept = (self.history(key) + _pair(user, assistant))[-2 * turns :]
        self._set(f"history:{key}", kept, SESSION_TTL)

    def drop_history(self, key: str) -> None:
        with self._lock:
            self._held.pop(f"history:{key}", None)

    def language(self, key: str) -> str | None:
        got = self._get(f"lang:{key}")
        return str(got) if got else None

    def set_language(self, key: str, lang: str) -> None:
        self._set(f"lang:{key}", lang, LANGUAGE_TTL)

    def flag(self, name: str, ttl: float) -> None:
        self._set(f"flag:{name}", True, ttl)

    def flagged(self, name: str) -> bool:
        return bool(self._get(f"flag:{name}"))


Scratch = RedisScratch | LocalScratch
