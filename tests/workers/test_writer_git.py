"""The in-process git of the writer, read back with the git CLI: what a person sees with `git log`,
`git fsck`, `git status`; one commit per turn for messages and hit counts; size linear in the data."""

from __future__ import annotations

import random
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from memory_core.history import undo
from memory_core.lineformat import format_time, parse_file
from memory_core.namespace import Namespace
from memory_core.ops import Forget, Record, Remember, Touch
from memory_core.store import MEMORY, Store
from memory_core.writer import Writer

NS = Namespace.of("t1", "u1", "default")
T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)


def _writer(data_dir: Path, clock: list[datetime]) -> Writer:
    return Writer(Store(data_dir), clock=lambda: clock[0])


def _record(i: int, when: datetime, text: str = "你好") -> Record:
    return Record(message={"id": f"m{i}", "ts": format_time(when), "speaker": "u", "text": text})


def test_the_git_cli_reads_the_repository_the_writer_made(data_dir: Path) -> None:
    clock = [T0]
    w = _writer(data_dir, clock)
    root = NS.path(data_dir)
    ids = []
    for i in range(40):  # enough commits for the loose objects to be packed
        clock[0] = T0 + timedelta(minutes=20 * i)
        ids.append(w.submit(NS, [Remember(text=f"我养的第{i}只猫叫{chr(0x4E00 + i)}花")])[0].id)
        w.submit(NS, [_record(i, clock[0], "长" * 300)])
    memory = root / MEMORY
    memory.write_text(memory.read_text("utf-8").replace("第3只猫", "第三只猫"), "utf-8")  # a hand edit
    w.submit(NS, [Forget(id=ids[5])])
    fsck = git(root, "fsck", "--strict", "--no-dangling")
    assert fsck.returncode == 0, fsck.stderr
    assert git(root, "status", "--porcelain").stdout == ""
    assert git(root, "symbolic-ref", "HEAD").stdout == "refs/heads/main\n"
    assert git(root, "count-objects", "-v").stdout.count("packs: 0") == 0  # packed as it grew
    subjects = git(root, "log", "--format=%s").stdout.splitlines()
    assert subjects[:2] == ["memory: 1 forgotten", "manual edit"]
    # 20 minutes apart: past the fold window, so each record stays a commit of its own
    assert subjects[2:] == ["memory: 1 recorded", "memory: 1 added"] * 40
    assert git(root, "show", "HEAD:MEMORY.md").stdout == memory.read_text("utf-8")
    assert "+" in git(root, "diff", "HEAD~1", "HEAD", "--", "MEMORY.md").stdout
    # The store's own reading of the history is git's.
    revs = git(root, "log", "--format=%H").stdout.split()
    assert [r["rev"] for r in w.store.history(NS, limit=500)] == revs
    assert [r for r, _ in w.store.revisions_touching(NS, (MEMORY,), 500)] == git(
        root, "log", "--format=%H", "--", "MEMORY.md"
    ).stdout.split()
    assert w.store.files_at(NS, "HEAD~1")[MEMORY] == git(root, "show", "HEAD~1:MEMORY.md").stdout
    assert w.store.resolve(NS, revs[3][:8]) == revs[3]
    assert "第三只猫" in w.store.show(NS, revs[1])


def test_messages_and_hit_counts_fold_into_one_commit_per_turn(data_dir: Path) -> None:
    clock = [T0]
    w = _writer(data_dir, clock)
    root = NS.path(data_dir)
    cat = w.submit(NS, [Remember(text="我养了一只猫")])[0].id
    w.submit(NS, [_record(1, T0, "我的猫叫什么")])
    w.submit(NS, [Touch(ids=(cat,), at=format_time(T0))])  # the reply used it
    w.submit(NS, [_record(2, T0, "它叫花花")])
    assert [r["message"] for r in w.store.history(NS)] == ["memory: 2 recorded, 1 updated", "memory: 1 added"]
    w.submit(NS, [Remember(text="我的猫叫花花")])  # the turn's fact: the turn is one commit
    assert [r["message"] for r in w.store.history(NS)] == [
        "memory: 1 added, 2 recorded, 1 updated",
        "memory: 1 added",
    ]
    day = git(root, "show", "HEAD:raw/2026-06-01.md").stdout
    assert "我的猫叫什么" in day and "它叫花花" in day
    assert git(root, "status", "--porcelain").stdout == ""
    done = undo(w, NS)  # the folded commit is still undone by what it changed in memory
    assert done.subject == "memory: 1 added, 2 recorded, 1 updated"
    texts = [e.text for e in parse_file((root / MEMORY).read_text("utf-8")).entries()]
    assert texts == ["我养了一只猫"]
    assert "它叫花花" in (root / "raw" / "2026-06-01.md").read_text("utf-8")
    # A record after a memory change, and one after the window, each start a commit of their own.
    w.submit(NS, [_record(3, T0)])
    clock[0] = T0 + timedelta(minutes=11)
    w.submit(NS, [_record(4, clock[0])])
    assert [r["message"] for r in w.store.history(NS)][:3] == [
        "memory: 1 recorded",
        "memory: 1 recorded",
        f"undo {done.rev[:10]}: memory: 1 added, 2 recorded, 1 updated",
    ]


def test_lock_files_a_killed_git_left_do_not_block_the_next_commit(data_dir: Path) -> None:
    w = Writer(Store(data_dir))
    w.submit(NS, [Remember(text="第一条")])
    git_dir = NS.path(data_dir) / ".git"
    for lock in ("index.lock", "HEAD.lock", "refs/heads/main.lock"):
        (git_dir / lock).write_text("")
    assert w.submit(NS, [Remember(text="第二条")])[0].status == "added"
    assert git(NS.path(data_dir), "log", "-1", "--format=%s").stdout.strip() == "memory: 1 added"
    assert git(NS.path(data_dir), "show", "HEAD:MEMORY.md").stdout.count("第") == 2


def test_the_repository_grows_with_the_data_not_a_whole_day_per_turn(data_dir: Path) -> None:
    """30 long messages (1,500 characters) and their replies: `.git` stays within 4× the raw archive."""
    rng = random.Random(5)
    clock = [T0]
    w = _writer(data_dir, clock)
    for i in range(30):
        clock[0] = T0 + timedelta(minutes=3 * i)
        text = "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(1500))
        w.submit(NS, [_record(2 * i, clock[0], text)])
        w.submit(NS, [_record(2 * i + 1, clock[0], text[:300])])
        if i % 3 == 0:
            w.submit(NS, [Remember(text=f"我的第{i}个习惯是{text[:12]}")])
    root = NS.path(data_dir)
    size = sum(p.stat().st_size for p in (root / ".git").rglob("*") if p.is_file())
    raw = sum(p.stat().st_size for p in (root / "raw").iterdir())
    assert size <= 4 * raw, (size, raw)
    assert git(root, "fsck", "--strict").returncode == 0
