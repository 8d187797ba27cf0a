"""Short-lived conversation state (session id, recent turns, language, flags), message text redacted first:
in Redis when there is one (every worker sees the same), else in this process; the wiring picks one."""

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
        pipe = self.client.pipeline()
        pipe.set(Keys.session(key), candidate, nx=True, ex=SESSION_TTL)
        pipe.get(Keys.session(key))
        pipe.expire(Keys.session(key), SESSION_TTL)
        value = pipe.execute()[1]
        return value.decode() if isinstance(value, bytes) else str(value or candidate)

    def history(self, key: str) -> list[dict[str, str]]:
        return [json.loads(r) for r in reversed(self.client.lrange(Keys.history(key), 0, -1))]

    def add_history(self, key: str, user: str, assistant: str, turns: int) -> None:
        pipe = self.client.pipeline()
        pipe.lpush(Keys.history(key), *[json.dumps(m, ensure_ascii=False) for m in _pair(user, assistant)])
        pipe.ltrim(Keys.history(key), 0, 2 * turns - 1)
        pipe.expire(Keys.history(key), SESSION_TTL)
        pipe.execute()

    def drop_history(self, key: str) -> None:
        self.client.delete(Keys.history(key))

    def drop_histories(self, prefix: str) -> None:
        """Every chat's history under `prefix` (a namespace key): what a forget drops."""
        keys = list(self.client.scan_iter(match=Keys.history(f"{prefix}:*"), count=500))
        if keys:
            self.client.delete(*keys)

    def language(self, key: str) -> str | None:
        value = self.client.get(Keys.language(key))
        return value.decode() if isinstance(value, bytes) else value

    def set_language(self, key: str, lang: str) -> None:
        if self.client.get(Keys.language(key)) != lang.encode():
            self.client.set(Keys.language(key), lang, ex=LANGUAGE_TTL)

    def flag(self, name: str, ttl: float) -> None:
        self.client.set(Keys.flag(name), "1", px=max(1, int(ttl * 1000)))

    def flagged(self, name: str) -> bool:
        return bool(self.client.exists(Keys.flag(name)))


class LocalScratch:
    """The same in this process (no Redis: the terminal chat); values expire as the Redis keys would."""

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
        value = str(self._get(Keys.session(key)) or candidate)
        self._set(Keys.session(key), value, SESSION_TTL)
        return value

    def history(self, key: str) -> list[dict[str, str]]:
        return list(self._get(Keys.history(key)) or [])

    def add_history(self, key: str, user: str, assistant: str, turns: int) -> None:
        self._set(Keys.history(key), (self.history(key) + _pair(user, assistant))[-2 * turns :], SESSION_TTL)

    def drop_history(self, key: str) -> None:
        self._set(Keys.history(key), None, 0)

    def drop_histories(self, prefix: str) -> None:
        start = Keys.history(f"{prefix}:")
        with self._lock:
            for key in [k for k in self._held if k.startswith(start)]:
                del self._held[key]

    def language(self, key: str) -> str | None:
        got = self._get(Keys.language(key))
        return str(got) if got else None

    def set_language(self, key: str, lang: str) -> None:
        self._set(Keys.language(key), lang, LANGUAGE_TTL)

    def flag(self, name: str, ttl: float) -> None:
        self._set(Keys.flag(name), True, ttl)

    def flagged(self, name: str) -> bool:
        return bool(self._get(Keys.flag(name)))


Scratch = RedisScratch | LocalScratch
