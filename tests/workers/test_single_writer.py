"""The single writer against a real redis-server and real files: concurrency, hand edits, crashes, fencing."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from memory_core.lineformat import parse_file
from memory_core.namespace import Namespace
from memory_core.ops import Edit, Outcome, Record, Remember
from memory_core.store import Store
from memory_core.writer import Writer
from workers.redis_backend import RedisLocker, RedisOpQueue

NS = Namespace.of("t1", "u1", "default")
ROOT = Path(__file__).resolve().parents[2]


def _texts(worker: int, n: int) -> list[str]:
    rng = random.Random(worker)
    return ["".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(12)) for _ in range(n)]


_WORKER = textwrap.dedent(
    """
    import json, sys, random
    import redis
    from pathlib import Path
    from memory_core.namespace import Namespace
    from memory_core.ops import Remember
    from memory_core.store import Store
    from memory_core.writer import Writer
    from workers.redis_backend import RedisLocker, RedisOpQueue
    data, url, worker, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(worker)
    texts = ["".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(12)) for _ in range(n)]
    client = redis.Redis.from_url(url)
    writer = Writer(Store(Path(data)), RedisLocker(client), RedisOpQueue(client))
    ns = Namespace.of("t1", "u1", "default")
    out = []
    for t in texts:
        o = writer.submit(ns, [Remember(text=t, type="fact")])[0]
        out.append(o.status)
    print(json.dumps(out))
    """
)


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_four_processes_lose_no_update_and_keep_a_hand_edit(
    data_dir: Path, redis_client: redis.Redis, redis_url: str
) -> None:
    procs = [_spawn(_WORKER, str(data_dir), redis_url, str(w), "250") for w in range(4)]
    memory = NS.path(data_dir) / "MEMORY.md"
    # A person edits the file while the writers run (appends a line, as an editor would save it).
    deadline = time.monotonic() + 60
    while not memory.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    with memory.open("a", encoding="utf-8") as fh:
        fh.write("- 这是我亲手加的一行\n")
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.extend(__import__("json").loads(out))
    assert results.count("added") == 1000, {s: results.count(s) for s in set(results)}

    doc = parse_file(memory.read_text("utf-8"))
    assert doc.problems() == []
    texts = [e.text for e in doc.entries()]
    expected = [t for w in range(4) for t in _texts(w, 250)]
    for t in expected:
        assert texts.count(t) == 1
    assert "这是我亲手加的一行" in texts  # kept, never overwritten

    log = subprocess.run(
        ["git", "-C", str(NS.path(data_dir)), "log", "--format=%s"], capture_output=True, text=True
    ).stdout
    subjects = log.splitlines()
    assert "manual edit" in subjects
    added = sum(int(m) for m in re.findall(r"(\d+) added", log))
    assert added == 1000  # one commit per batch, and the batches account for every op
    assert len([s for s in subjects if s.startswith("memory:")]) < 1000  # ops were batched


def test_hand_edit_is_committed_first_then_built_on(local_writer: Writer, data_dir: Path) -> None:
    local_writer.submit(NS, [Remember(text="我喜欢爬山")])
    memory = NS.path(data_dir) / "MEMORY.md"
    text = memory.read_text("utf-8").replace("我喜欢爬山", "我喜欢在周末爬山")
    memory.write_text(text + "- 我养了一只橘猫\n", "utf-8")
    out = local_writer.submit(NS, [Remember(text="我在余杭区")])[0]
    assert out.status == "added"
    final = memory.read_text("utf-8")
    assert "我喜欢在周末爬山" in final and "我养了一只橘猫" in final and "我在余杭区" in final
    subjects = [r["message"] for r in local_writer.store.history(NS)]
    assert subjects[0].startswith("memory:") and subjects[1] == "manual edit"
    show = subprocess.run(
        ["git", "-C", str(NS.path(data_dir)), "show", "HEAD~1:MEMORY.md"], capture_output=True, text=True
    ).stdout
    assert "我养了一只橘猫" in show and "我在余杭区" not in show


@pytest.mark.parametrize("marker", ["* ", "+ ", "1. ", "2) ", "  - ", "• "])
def test_a_line_rewritten_with_another_list_marker_stays_a_memory(
    local_writer: Writer, data_dir: Path, marker: str
) -> None:
    """A person who writes `* x` or `1. x` still means a memory: it was read as a note, so the entry it had
    been read as deleted by hand and was forgotten everywhere."""
    [kept] = local_writer.submit(NS, [Remember(text="我喜欢爬山"), Remember(text="我养了一只橘猫")])[:1]
    memory = NS.path(data_dir) / "MEMORY.md"
    text = memory.read_text("utf-8")
    memory.write_text(
        text.replace("- 我喜欢爬山", marker + "我喜欢在周末爬山").replace("- 我养", marker + "我养")
    )
    local_writer.submit(NS, [Remember(text="我在余杭区")])
    book, _ = local_writer.snapshot(NS)
    now = datetime.now(UTC)
    assert sorted(e.text for e in book.current(now)) == sorted(
        ["我在余杭区", "我养了一只橘猫", "我喜欢在周末爬山"]
    )
    assert book.get(kept.id or "") is not None and not book.problems()
    assert "- 我喜欢在周末爬山 <!--m:" in memory.read_text("utf-8")  # written back in the usual form


def test_the_strike_through_is_the_persons_to_set(local_writer: Writer, data_dir: Path) -> None:
    """Removing a history line's `~~` by hand was put back silently on the next write; wrapping a current
    line in `~~` kept it current with tildes in its text."""
    from memory_core.dream_light import apply_light, plan_light

    said = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
    local_writer.clock = lambda: said
    [old] = local_writer.submit(NS, [Remember(text="我在余杭区")])
    local_writer.clock = lambda: said + timedelta(days=1)  # moved: 余杭区 is history from here
    local_writer.submit(NS, [Remember(text="我现在在西湖区")])
    hike = local_writer.submit(NS, [Remember(text="我喜欢爬山")])[0]
    memory = NS.path(data_dir) / "MEMORY.md"
    text = (
        memory.read_text("utf-8")
        .replace("~~我在余杭区~~", "我在余杭区")
        .replace("- 我喜欢爬山", "- ~~我喜欢爬山~~")
    )
    memory.write_text(text, "utf-8")
    edited = said + timedelta(days=30)  # the person moved back, and edits the file a month later
    local_writer.clock = lambda: edited
    local_writer.submit(NS, [Remember(text="我养了一只橘猫")])
    book, _ = local_writer.snapshot(NS)
    now = edited + timedelta(minutes=1)
    current = {e.text for e in book.current(now)}
    assert "我在余杭区" in current and "我喜欢爬山" not in current
    struck = book.get(hike.id or "")
    assert struck is not None and struck.text == "我喜欢爬山" and struck.valid_to is not None
    written = memory.read_text("utf-8")
    assert "- 我在余杭区 <!--m:" in written and "- ~~我喜欢爬山~~ <!--m:" in written
    # …and a light dream's newest-wins keeps the person's choice: 余杭区 is the newer statement now
    apply_light(book, plan_light(book.entries(), now), now)
    assert "我在余杭区" in {e.text for e in book.current(now)} and book.get(old.id or "") is not None


def test_secret_typed_into_the_file_never_reaches_git(local_writer: Writer, data_dir: Path) -> None:
    local_writer.submit(NS, [Remember(text="我喜欢爬山")])
    memory = NS.path(data_dir) / "MEMORY.md"
    memory.write_text(memory.read_text("utf-8") + "- 我的密码是 Xk9#mQ2!vL7p\n", "utf-8")
    local_writer.submit(NS, [Remember(text="我在余杭区")])
    assert "Xk9#mQ2!vL7p" not in memory.read_text("utf-8")
    log = subprocess.run(
        ["git", "-C", str(NS.path(data_dir)), "log", "-p"], capture_output=True, text=True
    ).stdout
    assert "Xk9#mQ2!vL7p" not in log and "manual edit (1 secret(s) redacted)" in log


def test_hand_typed_secrets_are_redacted_in_place_and_counted_leaving_every_other_byte(
    local_writer: Writer, data_dir: Path
) -> None:
    """The `manual edit` commit holds the file as the person typed it, but each secret replaced where it
    stood: other lines, the metadata comments, even two lines joined by hand, are left exactly as they were."""
    local_writer.submit(NS, [Remember(text="我喜欢爬山")])
    memory = NS.path(data_dir) / "MEMORY.md"
    typed = memory.read_text("utf-8") + "".join(
        line + "\n"
        for line in (
            "- 我的密码是 Xk9#mQ2!vL7p",
            "- 备注 <!--m:id=ab12;t=fact--> 我的密码是 Qw8#nR3!zT6k <!--m:id=cd34;t=fact-->",
        )
    )
    memory.write_text(typed, "utf-8")
    local_writer.submit(NS, [Remember(text="我在余杭区")])
    repo = str(NS.path(data_dir))
    git = ["git", "-C", repo]
    commits = subprocess.run([*git, "log", "--format=%H %s"], capture_output=True, text=True).stdout
    [manual] = [c.split(" ", 1) for c in commits.splitlines() if " manual edit" in c]
    assert manual[1] == "manual edit (2 secret(s) redacted)"
    committed = subprocess.run(
        [*git, "show", f"{manual[0]}:MEMORY.md"], capture_output=True, text=True
    ).stdout
    assert committed == typed.replace("Xk9#mQ2!vL7p", "[REDACTED:password]").replace(
        "Qw8#nR3!zT6k", "[REDACTED:password]"
    )


@pytest.mark.parametrize("name", ["PROFILE.md", "DREAMS.md"])
def test_a_secret_typed_into_the_profile_or_dream_log_never_reaches_git(
    name: str, local_writer: Writer, data_dir: Path
) -> None:
    local_writer.submit(NS, [Remember(text="我喜欢爬山")])
    edited = NS.path(data_dir) / name
    before = edited.read_text("utf-8") if edited.exists() else ""
    edited.write_text(before + "我的密码是 Xk9#mQ2!vL7p\n", "utf-8")
    local_writer.submit(NS, [Remember(text="我在余杭区")])
    assert "Xk9#mQ2!vL7p" not in edited.read_text("utf-8") and "我的密码是" in edited.read_text("utf-8")
    log = subprocess.run(
        ["git", "-C", str(NS.path(data_dir)), "log", "-p"], capture_output=True, text=True
    ).stdout
    assert "Xk9#mQ2!vL7p" not in log and "manual edit (1 secret(s) redacted)" in log


def test_a_secret_in_a_malformed_hand_typed_line_never_reaches_git(
    local_writer: Writer, data_dir: Path
) -> None:
    """A line the parser cannot read (its metadata comment left open) is kept as typed, but not its secret."""
    local_writer.submit(NS, [Remember(text="我喜欢爬山")])
    memory = NS.path(data_dir) / "MEMORY.md"
    memory.write_text(memory.read_text("utf-8") + "- 我的密码是 Xk9#mQ2!vL7p <!--m:id=zz;t=fact\n", "utf-8")
    local_writer.submit(NS, [Remember(text="我在余杭区")])
    assert "Xk9#mQ2!vL7p" not in memory.read_text("utf-8")
    log = subprocess.run(
        ["git", "-C", str(NS.path(data_dir)), "log", "-p"], capture_output=True, text=True
    ).stdout
    assert "Xk9#mQ2!vL7p" not in log and "manual edit (1 secret(s) redacted)" in log


def test_malformed_line_survives_writes_and_is_reported(local_writer: Writer, data_dir: Path) -> None:
    local_writer.submit(NS, [Remember(text="我喜欢爬山")])
    memory = NS.path(data_dir) / "MEMORY.md"
    broken = "- 半截的行 <!--m:id=zz;t=fact"
    memory.write_text(memory.read_text("utf-8") + broken + "\n", "utf-8")
    local_writer.submit(NS, [Remember(text="我在余杭区")])
    assert broken in memory.read_text("utf-8").splitlines()
    assert any("not closed" in why for _, why in local_writer.problems)


_CRASHER = textwrap.dedent(
    """
    import sys, random
    from pathlib import Path
    from memory_core.namespace import Namespace
    from memory_core.ops import Remember, Record
    from memory_core.store import Store
    from memory_core.writer import Writer
    data, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    w = Writer(Store(Path(data)))
    ns = Namespace.of("t1", "u1", "default")
    i = 0
    while True:
        i += 1
        ops = [Remember(text="".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(10))) for _ in range(5)]
        ops.append(Record(message={"id": f"m{seed}-{i}", "ts": "2026-06-01T09:00:00Z", "speaker": "u", "text": "hi"}))
        w.submit(ns, ops)
    """
)


def _as_recovered(data_dir: Path, rel: str) -> str:
    """A file as the next writer will see it: as it is, or cut back to where the journal's unfinished
    append began (a torn tail that no journal records fails the caller's check)."""
    data = (NS.path(data_dir) / rel).read_bytes()
    journal = Store(data_dir).read_journal(NS) or {}
    spec = (journal.get("appends") or {}).get(rel)
    if spec is not None and not data.endswith(b"\n"):
        data = data[: int(spec["at"])]
    return data.decode("utf-8")


def test_sigkill_at_any_point_never_tears_a_file(data_dir: Path) -> None:
    memory = NS.path(data_dir) / "MEMORY.md"
    rng = random.Random(7)
    for round_no in range(12):
        p = _spawn(_CRASHER, str(data_dir), str(round_no))
        time.sleep(0.4 + rng.random() * 0.6)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        if memory.exists():
            # Each file is a whole batch's state; a cut append is the one exception, and only one the
            # journal records, so the next writer takes it back to that state (what is asserted here).
            doc = parse_file(_as_recovered(data_dir, "MEMORY.md"))
            assert doc.problems() == []
            raw = _as_recovered(data_dir, "raw/2026-06-01.md")
            assert raw.endswith("\n") and all(line.endswith("-->") for line in raw.splitlines()[2:])
    # A fresh writer recovers whatever batch was cut short and commits it; nothing is left uncommitted.
    w = Writer(Store(data_dir))
    w.submit(NS, [Remember(text="恢复之后的第一条")])
    status = subprocess.run(
        ["git", "-C", str(NS.path(data_dir)), "status", "--porcelain"], capture_output=True, text=True
    ).stdout
    assert status.strip() == ""
    ids = [e.id for e in parse_file(memory.read_text("utf-8")).entries()]
    assert len(ids) == len(set(ids))


def test_a_repository_left_without_its_gitignore_never_tracks_the_writers_own_files(data_dir: Path) -> None:
    """A writer killed between making `.git` and writing `.gitignore` left a repository whose next commit
    tracked `.lucid/` (journal, written hashes): git status was never clean again. The next writer puts
    the `.gitignore` back before it commits."""
    import pygit2

    root = NS.path(data_dir)
    root.mkdir(parents=True)
    pygit2.init_repository(str(root / ".git"), bare=True, initial_head="main").config["core.bare"] = False
    Writer(Store(data_dir)).submit(NS, [Remember(text="建库时被杀之后的第一条")])
    Writer(Store(data_dir)).submit(NS, [Remember(text="之后又写了一条")])
    tracked = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True).stdout
    assert "MEMORY.md" in tracked.split() and ".lucid" not in tracked
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout.strip() == ""


_APPENDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memory_core.namespace import Namespace
    from memory_core.ops import Remember
    from memory_core.store import Store
    from memory_core.writer import Writer
    w = Writer(Store(Path(sys.argv[1])))
    ns = Namespace.of("t1", "u1", "default")
    for i in range(3):
        print(w.submit(ns, [Remember(text=f"被杀的写者记下的第{i}件事，这一行够长" * 3)])[0].status, flush=True)
    """
)


def test_sigkill_mid_append_leaves_no_torn_line_once_recovered(data_dir: Path) -> None:
    """The kill point inside the append path: the writer dies with half a line appended to MEMORY.md.
    The next writer takes the cut append back (the file ends as the last whole batch left it), commits,
    and builds on it: no torn line, nothing acknowledged lost, git clean and equal to the file."""
    memory = NS.path(data_dir) / "MEMORY.md"
    env = {**os.environ, "LUCID_KILL_POINT": "append"}
    victim = subprocess.run(
        [sys.executable, "-c", _APPENDER, str(data_dir)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert victim.returncode == -signal.SIGKILL, victim.stderr[-2000:]
    assert victim.stdout.split() == ["added"]  # the first batch made the file; the second died appending
    cut = memory.read_bytes().decode("utf-8", errors="replace")  # cut mid-character, even
    assert not cut.endswith("\n") and "第1件事" in cut.rsplit("\n", 1)[1]  # half a line, as killed
    w = Writer(Store(data_dir))
    assert w.submit(NS, [Remember(text="恢复之后的第一条")])[0].status == "added"
    text = memory.read_text("utf-8")
    doc = parse_file(text)
    assert doc.problems() == [] and text.endswith("\n")
    texts = [e.text for e in doc.entries()]
    assert texts == [
        "被杀的写者记下的第0件事，这一行够长" * 3,
        "恢复之后的第一条",
    ]  # the cut one never landed
    root = NS.path(data_dir)
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == ""
    head = subprocess.run(["git", "-C", str(root), "show", "HEAD:MEMORY.md"], capture_output=True, text=True)
    assert head.stdout == text


_PAUSED = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import redis
    from memory_core.errors import LeaseLost
    from memory_core.namespace import Namespace
    from memory_core.store import Store
    from workers.redis_backend import RedisLocker
    data, url = sys.argv[1], sys.argv[2]
    store = Store(Path(data))
    ns = Namespace.of("t1", "u1", "default")
    lease = RedisLocker(redis.Redis.from_url(url), ttl_ms=400).acquire(ns, 5, store.read_fence(ns))
    store.claim_fence(ns, lease.token)
    snap = store.snapshot(ns)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        with store.fenced(ns, lease.token, lease.held):
            store.replace_files(ns, snap, {"MEMORY.md": "# Memory\\n\\n## Recall\\n\\n- stale writer was here\\n"})
        print("wrote", flush=True)
    except LeaseLost as exc:
        print("refused", exc, flush=True)
    """
)


def test_paused_writer_past_its_lease_cannot_overwrite(
    data_dir: Path, redis_client: redis.Redis, redis_url: str
) -> None:
    store = Store(data_dir)
    store.ensure_repo(NS)
    p = subprocess.Popen(
        [sys.executable, "-c", _PAUSED, str(data_dir), redis_url],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline().strip() == "ready"
    os.kill(p.pid, signal.SIGSTOP)
    time.sleep(0.8)  # past the 400 ms lease
    writer = Writer(store, RedisLocker(redis_client), RedisOpQueue(redis_client))
    assert writer.submit(NS, [Remember(text="新的持有者写的")])[0].status == "added"
    os.kill(p.pid, signal.SIGCONT)
    p.stdin.write("go\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=30)
    assert out.startswith("refused"), (out, err)
    text = (NS.path(data_dir) / "MEMORY.md").read_text("utf-8")
    assert "新的持有者写的" in text and "stale writer" not in text


def _redis_text(client: redis.Redis) -> str:
    """Every string, list and hash value in Redis, as one text (what an AOF or a replica would hold)."""
    parts: list[bytes] = []
    for key in client.scan_iter("*"):
        kind = client.type(key)
        if kind == b"string":
            parts.append(client.get(key) or b"")
        elif kind == b"list":
            parts.extend(client.lrange(key, 0, -1))
        elif kind == b"hash":
            parts.extend(v for kv in client.hgetall(key).items() for v in kv)
    return b"\n".join(parts).decode("utf-8", "replace")


@pytest.mark.parametrize("vault", [True, False], ids=["vault key", "no vault key"])
def test_over_redis_a_secret_never_enters_the_queue_and_only_a_statement_reaches_the_vault(
    vault: bool, data_dir: Path, redis_client: redis.Redis
) -> None:
    """The submitter screens ops before they travel through Redis: a secret statement or edit is refused
    on the spot (a statement sealed into the vault when a key is set), a recorded message is redacted."""
    from memory_core.vault import derive_key, unseal

    key = derive_key("correct horse battery staple") if vault else None
    store = Store(data_dir)
    now = datetime(2026, 6, 1, 9, 30, tzinfo=UTC)
    writer = Writer(store, RedisLocker(redis_client), RedisOpQueue(redis_client), lambda: now, vault_key=key)
    [added] = writer.submit(NS, [Remember(text="我喜欢爬山")])
    message = {
        "id": "om_1",
        "ts": "2026-06-01T09:00:00Z",
        "speaker": "密码 Qw8#nR3!zT6k",
        "text": "我的密码是 Xk9#mQ2!vL7p",
    }
    ops = [
        Remember(text="我的银行卡密码是 Zt5#pL9!wQ2m"),
        Edit(id=added.id or "", text="我喜欢爬山，密码是 Rv3#kM8!nB6x"),
        Record(message=message),
        Remember(text="我住在杭州"),
    ]
    held = RedisLocker(redis_client).acquire(NS, 1.0, store.read_fence(NS))  # another writer's turn
    assert held is not None
    result: list[list[Outcome]] = []
    submitter = threading.Thread(target=lambda: result.append(writer.submit(NS, ops)))
    submitter.start()
    while submitter.is_alive() and not redis_client.llen(f"lucid:ops:{NS.key}"):
        time.sleep(0.01)
    queued = _redis_text(redis_client)
    held.release()
    submitter.join(30)
    [outcomes] = result
    secrets = ("Zt5#pL9!wQ2m", "Rv3#kM8!nB6x", "Xk9#mQ2!vL7p", "Qw8#nR3!zT6k")
    assert not any(s in queued for s in secrets) and "[REDACTED:password]" in queued
    detail = "kept encrypted in the vault, not in memory" if vault else "looks like a secret; not stored"
    assert [(o.op_id, o.status, o.detail) for o in outcomes[:2]] == [
        (ops[0].op_id, "rejected:secret", detail),
        (ops[1].op_id, "rejected:secret", "looks like a secret; not stored"),  # an edit is never vaulted
    ]
    assert [o.status for o in outcomes[2:]] == ["recorded", "added"]
    sealed = [unseal(key, line) for line in store.read_vault(NS)] if key else store.read_vault(NS)
    statement = {"at": "2026-06-01T09:30:00Z", "text": "我的银行卡密码是 Zt5#pL9!wQ2m", "op": ops[0].op_id}
    assert sealed == ([statement] if vault else [])
    assert not any(
        s in p.read_text(errors="replace")
        for p in NS.path(data_dir).rglob("*")
        if p.is_file()
        for s in secrets
    )


def test_secret_goes_to_the_encrypted_vault_when_a_key_is_set(data_dir: Path) -> None:
    from memory_core.vault import derive_key, unseal

    key = derive_key("correct horse battery staple")
    writer = Writer(Store(data_dir), vault_key=key)
    out = writer.submit(NS, [Remember(text="我的银行卡密码是 Xk9#mQ2!vL7p")])[0]
    assert out.status == "rejected:secret" and "vault" in (out.detail or "")
    root = NS.path(data_dir)
    assert all("Xk9#mQ2!vL7p" not in p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())
    records = [unseal(key, line) for line in writer.store.read_vault(NS)]
    assert records[0]["text"] == "我的银行卡密码是 Xk9#mQ2!vL7p"
    status = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--ignored"], capture_output=True, text=True
    ).stdout
    assert ".vault/" in status  # ignored, never committed
