"""Forget for real: `forget --purge` rewrites a namespace's git history, `erase` removes a person."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from rq.exceptions import NoSuchJobError

from memory_core.entry import Entry
from memory_core.errors import InvalidInput, LeaseLost, LucidError, NotFound, StoreError
from memory_core.forgetting import FORGOTTEN, Forgotten, past_entries
from memory_core.ids import resolve_id
from memory_core.lineformat import REPLY_SUFFIX
from memory_core.namespace import Namespace, safe_component, stored_component
from memory_core.ops import Forget, Outcome
from memory_core.store import ARCHIVE, MEMORY
from memory_core.writer import FORGOTTEN_FROM

from .queues import extraction_job_id, fetch
from .redis_backend import REWRITE_PARKED, run
from .redis_keys import Keys

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)

_FILTER = """
import json, sys
import git_filter_repo as fr
from memory_core.forgetting import Forgotten, purge_blob
targets = [Forgotten(**t) for t in json.loads(sys.stdin.read())]
def blob(b, _meta):
    b.data = purge_blob(b.data, targets)
def commit(c, _meta):
    c.message = purge_blob(c.message, targets)
args = fr.FilteringOptions.parse_args(["--force", "--quiet"])
fr.RepoFilter(args, blob_callback=blob, commit_callback=commit).run()
"""


def purge(runtime: Runtime, ns: Namespace, entry_id: str) -> Outcome:
    """Forget `entry_id` and rewrite the namespace's git history so no commit holds it. An entry already
    forgotten (by chat, card, tool or a hand edit: those never purge) is found in git history by its id,
    and each text it ever had is removed from every commit. `entry_id` may be a prefix: it must name one
    entry among the current ones and those git history holds (a prefix naming both is ambiguous)."""
    entry_id = entry_id.strip().lower()
    try:
        runtime.writer.mend(ns)
    except LeaseLost as exc:
        return _lease_lost(entry_id, exc)
    book = runtime.writer.snapshot(ns)[0]
    entry = book.get(entry_id)
    if entry is None:
        current = book.entries() + book.archived()
        past = past_entries(runtime.store.past_texts(ns, (MEMORY, ARCHIVE)), [entry_id])
        try:
            entry_id = resolve_id([*current, *past], entry_id).id
        except NotFound:
            return Outcome(
                "purge", "rejected:not_found", detail=f"no entry {entry_id}, now or in git history"
            )
        entry = book.get(entry_id)
        if entry is None:
            return _purge_gone(runtime, ns, [e for e in past if e.id == entry_id])
    before = [e for i in entry.supersedes if (e := book.get(i)) is not None]

    kept: list[str] = []
    said = set(forgotten_from(runtime, ns))

    def rewrite(outcomes: list[Outcome]) -> None:
        if outcomes[0].ok:
            kept.extend(_rewrite(runtime, ns, Forgotten.with_cuts(entry, before)))

    try:
        outcome = runtime.writer.submit_then(ns, [Forget(entry_id)], rewrite)[0]
    except LeaseLost as exc:
        return _lease_lost(entry_id, exc)
    if not outcome.ok:
        return outcome
    forget_since(runtime, ns, said)
    detail = "forgotten, and removed from git history" + _kept_words(kept)
    return Outcome(outcome.op_id, "purged", id=entry_id, detail=detail)


def _purge_gone(runtime: Runtime, ns: Namespace, own: list[Entry]) -> Outcome:
    """`forget --purge` of an id no longer in the files: every version of it git still holds (`own`, the
    history's lines of that id, read once by `purge`) is removed."""
    ident = own[0].id
    before = sorted({i for e in own for i in e.supersedes})  # the lines a kept remainder was cut from
    older = past_entries(runtime.store.past_texts(ns, (MEMORY, ARCHIVE)), before) if before else []
    versions = [Forgotten.with_cuts(e, older) for e in own]
    targets = list({t.text: t for v in versions for t in v}.values())
    kept: list[str] = []
    try:
        runtime.writer.submit_then(ns, [], lambda _outcomes: kept.extend(_rewrite(runtime, ns, targets)))
    except LeaseLost as exc:
        return _lease_lost(ident, exc)
    forget_around(runtime, ns, [t.origin for t in targets if t.origin])
    detail = "already forgotten; now removed from git history too" + _kept_words(kept)
    return Outcome("purge", "purged", id=ident, detail=detail)


def _rewrite(runtime: Runtime, ns: Namespace, targets: Sequence[Forgotten]) -> list[str]:
    """Under the writer's lease: the history without `targets`, and the files on disk are what HEAD holds.
    A target's words that an entry still held says too (said again after the forget, or in another chat's
    scope) are not cut: the rewrite reaches HEAD, so it would cut them from that entry as well. The target's
    own lines and message still go. Returns the ids of the entries that kept them."""
    book = runtime.writer.snapshot(ns)[0]
    ids = {t.id for t in targets}
    held = [e for e in book.entries() + book.archived() if e.id not in ids]
    kept: list[str] = []
    cut: list[Forgotten] = []
    for t in targets:
        words = t.text.strip().casefold() if t.within is None else ""  # a scoped cut reaches its line only
        sayers = [e.id for e in held if words and words in e.text.casefold()]
        kept += sayers
        cut.append(replace(t, text="") if sayers else t)
    rewrite_history(runtime.store.path(ns), cut)
    runtime.store.record_written(ns, hashes=runtime.store.snapshot(ns).hashes)
    return list(dict.fromkeys(kept))


def _lease_lost(ident: str, exc: LeaseLost) -> Outcome:
    """The writer lease lapsed before the rewrite (the process was paused): another holder may have written
    since, so git history was left as it is; the purge can simply be run again."""
    log.warning("purge of %s refused: %s", ident, exc)
    detail = "git history was not rewritten: the writer lease was lost meanwhile; run the purge again"
    return Outcome("purge", "rejected:lease_lost", id=ident, detail=detail)


def _kept_words(kept: Sequence[str]) -> str:
    if not kept:
        return ""
    return f"; its words stay where entry {', '.join(i[:8] for i in kept)} says them too (forget that too)"


def forgotten_from(runtime: Runtime, ns: Namespace) -> list[str]:
    """The messages that said a forgotten fact (the writer's `forgotten_from`, newest last)."""
    return [str(m) for m in runtime.store.state_value(ns, FORGOTTEN_FROM) or ()]


def forget_since(runtime: Runtime, ns: Namespace, known: set[str]) -> None:
    """`forget_around` for the messages a forget just added to `forgotten_from` (it held `known` before)."""
    forget_around(runtime, ns, [m for m in forgotten_from(runtime, ns) if m not in known])


def forget_around(runtime: Runtime, ns: Namespace, said: Sequence[str]) -> None:
    """What a forget drops besides the files, for the raw lines that said the fact (`om_1`, or a reply
    `om_1:reply`): the short history; a message's queued extraction; a reply's words in the extraction
    of the message it answered (the message itself is still learned from); and a parked reply."""
    messages = [m for m in said if not m.endswith(REPLY_SUFFIX)]
    answered = [m.removesuffix(REPLY_SUFFIX) for m in said if m.endswith(REPLY_SUFFIX)]
    drop_short_history(runtime, ns)
    drop_pending_extractions(runtime, ns, messages)
    forget_replies_in_extractions(runtime, ns, answered)
    forget_parked_replies(runtime, ns, [*messages, *answered])


def forget_replies_in_extractions(runtime: Runtime, ns: Namespace, message_ids: Sequence[str]) -> None:
    """A queued extraction carries the reply beside the person's message (`turn._enqueue_extraction`):
    the reply that used a forgotten fact is replaced by the forgotten marker there."""
    if runtime.redis is None:
        return
    for message_id in message_ids:
        try:
            job = fetch(extraction_job_id(ns.persona, message_id), runtime.redis)
            args = list(job.args)
            if len(args) > 2 and args[2] != FORGOTTEN:
                args[2] = FORGOTTEN
                job.args = tuple(args)
                job.description = job.get_call_string()  # RQ keeps the call, arguments included, there too
                job.save()
        except NoSuchJobError:
            continue
        except redis.RedisError as exc:
            log.warning("could not forget a reply in a queued extraction: %s", type(exc).__name__)


def forget_parked_replies(runtime: Runtime, ns: Namespace, message_ids: Sequence[str]) -> None:
    """A reply still waiting for Feishu (parked) to a message that said the fact or whose reply used it
    goes out as the forgotten marker, not in clear, and its text leaves Redis."""
    if runtime.redis is None or not message_ids:
        return
    script = runtime.redis.register_script(REWRITE_PARKED)
    for message_id in message_ids:
        try:
            run(runtime.redis, script, [Keys.reply(ns.persona, message_id)], [FORGOTTEN])
        except redis.RedisError as exc:
            log.warning("could not forget a parked reply: %s", type(exc).__name__)


def drop_short_history(runtime: Runtime, ns: Namespace) -> None:
    """Forget reaches the model's short conversation history too (the last few turns of each chat replayed
    to the model, in Redis or, for the terminal chat, in the process): it is dropped, so a forgotten fact
    is not re-read from there."""
    try:
        runtime.scratch.drop_histories(ns.key)
    except redis.RedisError as exc:
        log.warning("could not drop the short history of %s: %s", ns.key, type(exc).__name__)


def drop_pending_extractions(runtime: Runtime, ns: Namespace, message_ids: Sequence[str]) -> None:
    """A forgotten entry's message may still wait for its extraction on the memory queue, its text in the
    job's arguments: the job is deleted (the writer refuses what it would learn anyway)."""
    if runtime.redis is None or not message_ids:
        return
    for message_id in message_ids:
        try:
            fetch(extraction_job_id(ns.persona, message_id), runtime.redis).delete()
        except NoSuchJobError:
            continue
        except redis.RedisError as exc:
            log.warning("could not drop the extraction of a forgotten message: %s", type(exc).__name__)


def rewrite_history(root: Path, targets: Sequence[Forgotten]) -> None:
    """Run git-filter-repo in the namespace's repository with the forget redaction on every blob."""
    if not (root / ".git").exists():
        return
    payload = json.dumps([t.__dict__ for t in targets], ensure_ascii=False)
    done = subprocess.run(
        [sys.executable, "-c", _FILTER],
        cwd=root,
        input=payload,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=_git_env(),
    )
    if done.returncode != 0:
        raise StoreError(f"rewriting git history failed: {(done.stderr or done.stdout).strip()[-300:]}")


def _git_env() -> dict[str, str]:
    return {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


@dataclass
class Erasure:
    """What `erase_user` removed (counts only: no ids or text of the person are kept)."""

    namespaces: list[str] = field(default_factory=list)
    redis_keys: int = 0
    redis_members: int = 0
    jobs: int = 0
    # Redis's append-only file after the erase: rewritten, rewriting (still running), off, or unavailable
    # (a managed Redis that refuses CONFIG/BGREWRITEAOF: its operator must compact it)
    aof: str = "off"

    def to_json(self) -> dict[str, Any]:
        return {
            "namespaces": self.namespaces,
            "redis_keys": self.redis_keys,
            "redis_members": self.redis_members,
            "jobs": self.jobs,
            "aof": self.aof,
        }


def erase_user(runtime: Runtime, user: str, tenant: str | None = None) -> Erasure:
    """Remove a person completely, files and Redis keys (docs/PRIVACY.md, "`lucid erase`"); each namespace
    is erased under its writer lease after its queued ops are dropped, so no batch writes it back."""
    if not user.strip():
        raise InvalidInput("erase needs a user id")
    data = runtime.store.data_dir
    tenants = [safe_component(tenant)] if tenant else sorted(p.name for p in data.iterdir() if p.is_dir())
    report = Erasure()
    hashed, named = safe_component(user), stored_component(user)  # named: the folder's own name, from `ls`
    for t in tenants:
        safe_user = hashed if (data / t / hashed).is_dir() else named
        home = data / t / safe_user
        if not home.is_dir() or home.is_symlink():
            continue
        namespaces = [Namespace.at(t, safe_user, p.name) for p in sorted(home.iterdir()) if p.is_dir()]
        needles = _needles(runtime, t, user, safe_user, namespaces)
        leases = []
        try:
            for ns in namespaces:
                if runtime.redis is not None:
                    runtime.redis.delete(Keys.ops(ns.key))  # queued writes never land afterwards
                lease = runtime.writer.locker.acquire(ns, runtime.writer.lease_wait, 0)
                if lease is None:
                    raise LucidError(f"could not take the writer lease of {ns}: try again")
                leases.append(lease)
            if runtime.redis is not None:
                _erase_redis(runtime.redis, needles, report)
            shutil.rmtree(home)
        finally:
            for lease in leases:
                with contextlib.suppress(Exception):
                    lease.release()
        report.namespaces += [str(ns) for ns in namespaces]
        log.warning("erased %d namespace(s) of a user in tenant %s", len(namespaces), t)
    if report.namespaces and runtime.redis is not None:
        report.aof = rewrite_aof(runtime.redis)
    return report


AOF_WAIT = 30.0  # seconds erase waits for Redis to finish rewriting its append-only file


def rewrite_aof(client: redis.Redis, wait: float = AOF_WAIT) -> str:
    """Redis keeps every write in its append-only file (the embedded one under <data>/.redis) until it
    rewrites the file from what it holds now: the deleted keys stay readable on disk until then. Start a
    rewrite that begins after the deletes (one already running may predate them: wait for it, then ask
    again) and wait a while for it to end."""
    try:
        if _text(next(iter(client.config_get("appendonly").values()), b"")) != "yes":
            return "off"
        deadline = time.monotonic() + wait
        while True:
            try:
                client.bgrewriteaof()
                break
            except redis.ResponseError as exc:
                if "in progress" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        while time.monotonic() < deadline:
            info = client.info("persistence")
            if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
                return "rewritten" if info.get("aof_last_bgrewrite_status") == "ok" else "failed"
            time.sleep(0.05)
        return "rewriting"
    except redis.ResponseError as exc:
        log.warning("could not rewrite Redis's append-only file after an erase: %s", exc)
        return "unavailable"


@dataclass(frozen=True)
class _Needles:
    """What marks a Redis key or value as the person's: namespace keys and paths, their user id, the ids
    of their messages and their one-to-one chats (group chat ids are shared, so never a needle)."""

    exact: frozenset[str]
    pattern: re.Pattern[str]

    def found(self, text: str) -> bool:
        return bool(self.pattern.search(text))


def _needles(
    runtime: Runtime, tenant: str, user: str, safe_user: str, namespaces: Sequence[Namespace]
) -> _Needles:
    words: set[str] = {f"{tenant}/{safe_user}/"}
    for ns in namespaces:
        words.add(ns.key)
        for msg in runtime.store.iter_raw(ns):
            words.add(msg.id.split(":")[0])
            if msg.chat_type == "p2p" and msg.chat:
                words.add(msg.chat)
            if msg.session:
                words.add(msg.session)
    ids = {user, safe_user}
    words |= {i for i in ids if len(i) >= 8}  # a short id ("default", "alice") would match strangers
    words = {w for w in words if len(w) >= 6 or "/" in w}
    body = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    # The person's plain id also counts inside JSON ("user": "alice") and key segments (:alice:).
    quoted = "|".join(rf'"{re.escape(i)}"|:{re.escape(i)}(?::|$)' for i in sorted(ids) if i)
    return _Needles(frozenset(words), re.compile("|".join(p for p in (body, quoted) if p)))


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _erase_redis(client: redis.Redis, needles: _Needles, report: Erasure) -> None:
    """Delete the person's `lucid:*` keys, their members of shared collections and the RQ jobs naming them;
    `lucid:seen:*` markers stay until they expire, or a re-delivery would record the message again."""
    for raw_key in client.scan_iter(match="rq:job:*", count=1000):
        key = _text(raw_key)
        if key.count(":") != 2:
            continue
        description = _text(client.hget(key, "description") or b"")
        if needles.found(description) or needles.found(key):
            _delete_job(client, key.split(":", 2)[2])
            report.jobs += 1
    for raw_key in client.scan_iter(match=Keys.PREFIX + "*", count=1000):
        key = _text(raw_key)
        if key.startswith(Keys.SEEN) and _text(client.get(key) or b"") == "1":
            continue
        if needles.found(key):
            report.redis_keys += client.delete(key)
            continue
        report.redis_members += _prune_value(client, key, needles, report)


def _prune_value(client: redis.Redis, key: str, needles: _Needles, report: Erasure) -> int:
    kind = _text(client.type(key))
    removed = 0
    if kind == "string":
        if needles.found(_text(client.get(key) or b"")):
            report.redis_keys += client.delete(key)
    elif kind == "list":
        for item in client.lrange(key, 0, -1):
            if needles.found(_text(item)):
                removed += int(client.lrem(key, 0, _text(item)))
    elif kind == "set":
        hit = [m for m in client.smembers(key) if needles.found(_text(m))]
        removed += int(client.srem(key, *hit)) if hit else 0
    elif kind == "zset":
        hit = [m for m, _ in client.zscan_iter(key) if needles.found(_text(m))]
        removed += int(client.zrem(key, *hit)) if hit else 0
    elif kind == "hash":
        hit = [f for f, v in client.hscan_iter(key) if needles.found(_text(f)) or needles.found(_text(v))]
        removed += int(client.hdel(key, *hit)) if hit else 0
    return removed


def _delete_job(client: redis.Redis, job_id: str) -> None:
    """Delete one RQ job and its place in every queue and registry, whatever its serializer."""
    try:
        fetch(job_id, client).delete(remove_from_queue=True)
        return
    except Exception:  # an unreadable payload (another serializer): remove it by hand
        pass
    client.delete(f"rq:job:{job_id}", f"rq:job:{job_id}:dependents", f"rq:job:{job_id}:dependencies")
    for raw in client.scan_iter(match="rq:*", count=1000):
        key = _text(raw)
        kind = _text(client.type(key))
        if kind == "list":
            client.lrem(key, 0, job_id)
        elif kind == "zset":
            client.zrem(key, job_id)
        elif kind == "set":
            client.srem(key, job_id)
