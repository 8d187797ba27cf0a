"""The writer's append-only path, on real files and a real git repository: a batch that only adds lines
appends them (the file keeps its inode) and ends byte for byte where a whole render would; anything else,
or a file a person edited, is rendered whole; a hand edit is never written over; queued ops are one batch."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis

from memory_core.book import Book
from memory_core.lineformat import format_time, parse_file, render_file
from memory_core.namespace import Namespace
from memory_core.ops import Forget, Pin, Record, Remember, Touch
from memory_core.store import ARCHIVE, MEMORY, Store
from memory_core.writer import Writer
from workers.redis_backend import RedisLocker, RedisOpQueue

NS = Namespace.of("t1", "u1", "default")
T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def _whole_render(text: str) -> str:
    doc = parse_file(text)
    return render_file(Book(doc).memory_file())


def _inode(path: Path) -> int:
    return os.stat(path).st_ino


def test_a_batch_of_new_memories_is_appended_and_ends_exactly_as_a_whole_render(data_dir: Path) -> None:
    clock = [T0]
    w = Writer(Store(data_dir), clock=lambda: clock[0])
    root = NS.path(data_dir)
    memory = root / MEMORY
    # A history with every kind of change: supersede, pin (to Resident), forget, hit counts, messages.
    first = w.submit(NS, [Remember(text="我住在余杭区"), Remember(text="我喜欢爬山")])
    w.submit(NS, [Remember(text="我现在住在西湖区")])
    w.submit(NS, [Pin(id=first[1].id)])
    w.submit(NS, [Remember(text="我养了一只橘猫"), Remember(text="我不吃香菜")])
    cat = parse_file(memory.read_text("utf-8"))
    w.submit(NS, [Touch(ids=tuple(e.id for e in cat.entries()), at=format_time(T0))])
    w.submit(NS, [Forget(id=first[0].id)])
    for day in range(6):
        clock[0] = T0 + timedelta(hours=day)
        inode = _inode(memory)
        ops = [
            Remember(text=f"第{day}天记下的第{i}件事是关于{chr(0x4E00 + 7 * day + i)}的") for i in range(3)
        ]
        ops.append(
            Record(message={"id": f"m{day}", "ts": format_time(clock[0]), "speaker": "u", "text": "嗯"})
        )
        assert [o.status for o in w.submit(NS, ops)] == ["added"] * 3 + ["recorded"]
        text = memory.read_text("utf-8")
        assert _inode(memory) == inode  # appended in place, not rewritten
        assert text == _whole_render(text)  # exactly what rendering the whole book writes
        assert _git(root, "show", "HEAD:MEMORY.md") == text
    # A change that is not only new lines is written whole (a new file), and still renders the same.
    inode = _inode(memory)
    w.submit(NS, [Remember(text="我现在住在滨江区")])  # supersedes 西湖区: an old line changes
    text = memory.read_text("utf-8")
    assert _inode(memory) != inode and text == _whole_render(text)
    assert "~~我现在住在西湖区~~" in text
    assert _git(root, "status", "--porcelain") == ""
    assert parse_file(text).problems() == []


def test_a_pinned_memory_goes_under_resident_not_appended_at_the_end(data_dir: Path) -> None:
    w = Writer(Store(data_dir))
    memory = NS.path(data_dir) / MEMORY
    w.submit(NS, [Remember(text="我喜欢爬山")])
    w.submit(NS, [Remember(text="请一直用中文回答我", type="instruction")])  # a resident kind
    doc = parse_file(memory.read_text("utf-8"))
    resident = doc.section("resident")
    assert resident is not None and [e.text for e in resident.items if hasattr(e, "text")] == [
        "请一直用中文回答我"
    ]
    assert memory.read_text("utf-8") == _whole_render(memory.read_text("utf-8"))


def test_a_hand_edit_is_never_appended_to_blindly_nor_written_over(data_dir: Path) -> None:
    w = Writer(Store(data_dir))
    root = NS.path(data_dir)
    memory = root / MEMORY
    w.submit(NS, [Remember(text="我喜欢爬山")])
    w.submit(NS, [Remember(text="我养了一只橘猫")])
    # A person adds a section at the end and leaves the last line without its newline.
    text = memory.read_text("utf-8")
    memory.write_text(text + "\n## 我的笔记\n\n- 这是我亲手写的", "utf-8")
    out = w.submit(NS, [Remember(text="我在余杭区工作")])
    assert out[0].status == "added"
    final = memory.read_text("utf-8")
    doc = parse_file(final)
    assert doc.problems() == []
    texts = [e.text for e in doc.entries()]
    assert "这是我亲手写的" in texts and "我在余杭区工作" in texts
    recall = doc.section("recall")
    assert recall is not None and "我在余杭区工作" in [getattr(i, "text", "") for i in recall.items]
    assert [r["message"] for r in w.store.history(NS)][:2] == ["memory: 1 added", "manual edit"]
    assert "这是我亲手写的" in _git(root, "show", "HEAD~1:MEMORY.md")
    # The same size, another letter, no newline added: the hash tells, and the edit is kept.
    text = memory.read_text("utf-8")
    memory.write_text(text.replace("橘猫", "黑猫"), "utf-8")
    w.submit(NS, [Remember(text="我周末去游泳")])
    final = memory.read_text("utf-8")
    assert "黑猫" in final and "橘猫" not in final and "我周末去游泳" in final
    assert _git(root, "status", "--porcelain") == ""


def test_ops_queued_by_others_are_applied_as_one_batch_and_one_commit(
    data_dir: Path, redis_client: redis.Redis
) -> None:
    queue = RedisOpQueue(redis_client)
    w = Writer(Store(data_dir), RedisLocker(redis_client), queue)
    w.submit(NS, [Remember(text="最早的一条")])
    waiting = [Remember(text=f"别的进程排队的第{i}条：{chr(0x4E00 + 31 * i)}") for i in range(20)]
    queue.push(NS, waiting)  # ops of submitters that wait for the lease
    mine = w.submit(NS, [Remember(text="拿到租约的这个进程自己的一条")])
    assert mine[0].status == "added"
    done = queue.results([op.op_id for op in waiting], 0)
    assert sorted(o.status for o in done.values()) == ["added"] * 20
    subjects = [r["message"] for r in w.store.history(NS)]
    assert subjects == ["memory: 21 added", "memory: 1 added"]


def test_after_a_hand_edit_the_next_write_renders_the_whole_file_once(data_dir: Path) -> None:
    """A person's layout (blank lines, spacing) is not carried on by appends: the file was not rendered by
    the writer, so its next write renders it whole, the person's content kept; appends resume after."""
    w = Writer(Store(data_dir))
    memory = NS.path(data_dir) / MEMORY
    w.submit(NS, [Remember(text="我喜欢爬山"), Remember(text="我养了一只橘猫")])
    text = memory.read_text("utf-8")
    memory.write_text(text.replace("\n- ", "\n\n\n- "), "utf-8")  # blank lines between the entries
    w.submit(NS, [Remember(text="我在余杭区工作")])
    text = memory.read_text("utf-8")
    assert text == _whole_render(text) and "\n\n\n" not in text
    assert {"我喜欢爬山", "我养了一只橘猫", "我在余杭区工作"} <= {e.text for e in parse_file(text).entries()}
    inode = _inode(memory)
    w.submit(NS, [Remember(text="我周末去游泳")])
    assert _inode(memory) == inode  # appended again


def test_lines_are_appended_only_to_a_file_that_ends_as_the_book_renders() -> None:
    """The book's own check, on text it was not rendered from: a last line without its newline, or a
    section a person added at the end, gets no lines appended (the writer renders the whole file)."""
    base = render_file(Book().memory_file())
    book = Book(parse_file(base))
    book.apply(Remember(text="我喜欢爬山"), T0)
    assert book.memory_appended(base) is not None  # the empty Recall section: heading, blank, the line
    assert base + (book.memory_appended(base) or "") == render_file(book.memory_file())
    text = render_file(book.memory_file())
    for edited in (text.rstrip("\n"), text + "\n## 笔记\n"):
        other = Book(parse_file(edited))
        other.apply(Remember(text="我养了一只橘猫"), T0)
        assert other.memory_appended(edited) is None


def test_the_batches_of_one_lease_are_one_git_commit(data_dir: Path, redis_client: redis.Redis) -> None:
    """Group commit: more ops queued than one batch takes (MAX_BATCH) are applied batch after batch by the
    one holder of the lease, and its batches are committed to git once, when it lets the lease go. The op
    that made this process the leader is answered with the first batch; a thread applies the rest."""
    queue = RedisOpQueue(redis_client)
    w = Writer(Store(data_dir), RedisLocker(redis_client), queue)
    w.submit(NS, [Remember(text="最早的一条")])
    queued = [
        Remember(text=f"排队的第{i}条：{chr(0x4E00 + 13 * i)}{chr(0x4E00 + 7 * i + 3)}") for i in range(600)
    ]
    queue.push(NS, queued)
    assert w.submit(NS, [Remember(text="拿到租约的这个进程自己的一条")])[0].status == "added"
    w.settle()  # the leader thread: the other 100, then the commit
    assert queue.pending(NS, 1) == []  # 500 of them with its own op, then the other 100
    done = queue.results([op.op_id for op in queued], 0)
    assert len(done) == 600 and {o.status for o in done.values()} == {"added"}
    assert [r["message"] for r in w.store.history(NS)] == ["memory: 601 added", "memory: 1 added"]
    root = NS.path(data_dir)
    assert _git(root, "status", "--porcelain") == ""
    assert _git(root, "show", "HEAD:MEMORY.md") == (root / MEMORY).read_text("utf-8")


def test_a_new_persons_first_writes_make_no_archive(data_dir: Path) -> None:
    """A first write makes MEMORY.md alone: no empty ARCHIVE.md to write, fsync and commit. Supersedes
    keep the old line struck through in MEMORY.md; the archive is made by the first light dream that
    moves a line there (tests/workers/test_dreaming.py), and history reads every commit meanwhile."""
    w = Writer(Store(data_dir))
    root = NS.path(data_dir)
    w.submit(NS, [Remember(text="我住在余杭区")])
    for i in range(3):
        w.submit(NS, [Remember(text=f"我养了第{i}只猫")])
    w.submit(NS, [Remember(text="我现在住在西湖区")])  # supersedes 余杭区
    assert "~~我住在余杭区~~" in (root / MEMORY).read_text("utf-8")
    assert not (root / ARCHIVE).exists()
    assert ARCHIVE not in _git(root, "ls-tree", "--name-only", "HEAD").split()
    assert _git(root, "status", "--porcelain") == ""
    rows = w.store.history(NS)
    assert len(rows) == 5 and all(r["message"].startswith("memory: ") for r in rows)
