"""The store's fencing and the writer's raw-archive redaction, each check pinned on its own.

A stale writer must be refused for either reason alone (an older token, or a lease it no longer holds), and
the no-Redis path must redact a secret before it reaches raw/ or git. Real files and a real git repository.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from memory_core.errors import LeaseLost
from memory_core.namespace import Namespace
from memory_core.ops import Outcome, Record, Remember
from memory_core.store import Store
from memory_core.writer import Writer

NS = Namespace.of("t1", "u1", "default")
SECRET = "Xk9#mQ2!vL7p"
STALE = "# Memory\n\n## Recall\n\n- 过期的持有者写的\n"


def _memory(data_dir: Path) -> str:
    path = NS.path(data_dir) / "MEMORY.md"
    return path.read_text("utf-8") if path.exists() else ""


def _stale_write(store: Store, token: int, held: bool) -> None:
    snap = store.snapshot(NS)
    with store.fenced(NS, token, lambda: held):
        store.replace_files(NS, snap, {"MEMORY.md": STALE})


def test_fenced_refuses_an_older_token_even_while_its_lease_still_looks_held(data_dir: Path) -> None:
    """A paused holder whose clock says 'held' but whose token was superseded must not write."""
    store = Store(data_dir)
    writer = Writer(store)
    writer.submit(NS, [Remember(text="新的持有者写的")])  # the new holder claimed a newer token
    newest = store.read_fence(NS)
    with pytest.raises(LeaseLost):
        _stale_write(store, newest - 1, held=True)
    assert "新的持有者写的" in _memory(data_dir) and "过期的持有者" not in _memory(data_dir)


def test_fenced_refuses_the_current_token_once_the_lease_is_no_longer_held(data_dir: Path) -> None:
    """The token is still the newest on disk, but the lease expired: the write is refused all the same."""
    store = Store(data_dir)
    Writer(store).submit(NS, [Remember(text="我在余杭区")])
    current = store.read_fence(NS)
    with pytest.raises(LeaseLost):
        _stale_write(store, current, held=False)
    assert "我在余杭区" in _memory(data_dir) and "过期的持有者" not in _memory(data_dir)


def test_fenced_lets_the_current_holder_write(data_dir: Path) -> None:
    store = Store(data_dir)
    store.ensure_repo(NS)
    store.claim_fence(NS, 7)
    _stale_write(store, 7, held=True)
    assert "过期的持有者写的" in _memory(data_dir)


def test_claim_fence_refuses_a_token_older_than_the_newest_and_keeps_the_newest(data_dir: Path) -> None:
    store = Store(data_dir)
    store.claim_fence(NS, 5)
    store.claim_fence(NS, 5)  # the holder of 5 claims once per batch: idempotent
    with pytest.raises(LeaseLost, match="token 4 is older than 5"):
        store.claim_fence(NS, 4)
    assert store.read_fence(NS) == 5
    store.claim_fence(NS, 9)
    assert store.read_fence(NS) == 9


def test_a_newer_claim_waits_for_the_fenced_write_in_progress(data_dir: Path) -> None:
    """Claim and fenced write share one lock: the fence cannot move between the token check and the rename.
    A newer holder's claim made while the old holder is inside `fenced` lands only after the write."""
    store = Store(data_dir)
    store.ensure_repo(NS)
    store.claim_fence(NS, 1)
    seen_inside: list[int] = []
    claimer = threading.Thread(target=store.claim_fence, args=(NS, 2))
    snap = store.snapshot(NS)
    with store.fenced(NS, 1, lambda: True):
        claimer.start()
        claimer.join(0.5)  # it cannot finish while we hold the fence lock (if it could, it would have by now)
        seen_inside.append(store.read_fence(NS))
        store.replace_files(NS, snap, {"MEMORY.md": STALE})
    claimer.join(10)
    assert seen_inside == [1] and not claimer.is_alive() and store.read_fence(NS) == 2
    with pytest.raises(LeaseLost):
        _stale_write(store, 1, held=True)  # and from then on the old holder is fenced out


def test_a_writer_with_a_stale_lease_applies_nothing(data_dir: Path) -> None:
    """End to end: a writer whose lease carries an older token than the disk's refuses the whole batch."""

    class StaleLease:
        token = 1

        def held(self) -> bool:
            return True

        def release(self) -> None:
            pass

    class StaleLocker:
        def acquire(self, ns: Namespace, wait: float, floor: int) -> StaleLease:
            return StaleLease()

    store = Store(data_dir)
    Writer(store).submit(NS, [Remember(text="我在余杭区")])
    store.claim_fence(NS, 10)  # someone newer holds the namespace
    with pytest.raises(LeaseLost):
        Writer(store, StaleLocker()).submit(NS, [Remember(text="过期的持有者写的")])
    assert "过期的持有者" not in _memory(data_dir)


def _git_log(data_dir: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(NS.path(data_dir)), "log", "-p", "--all"], capture_output=True, text=True
    ).stdout


def test_without_redis_a_secret_in_a_recorded_message_never_reaches_raw_or_git(data_dir: Path) -> None:
    writer = Writer(Store(data_dir))  # LocalLocker, no queue: the writer's own redaction is the only guard
    message = {
        "id": "om_secret_1",
        "ts": "2026-06-01T09:00:00Z",
        "speaker": "alice",
        "text": f"我的密码是 {SECRET}，帮我记一下",
    }
    [outcome] = writer.submit(NS, [Record(message=message)])
    assert (outcome.status, outcome.detail) == ("recorded", "redacted")
    raw = (NS.path(data_dir) / "raw" / "2026-06-01.md").read_text("utf-8")
    assert SECRET not in raw and "[REDACTED:" in raw and "帮我记一下" in raw  # the rest of the line is kept
    log = _git_log(data_dir)
    assert "raw/2026-06-01.md" in log and SECRET not in log
    assert all(
        SECRET not in p.read_text(errors="replace") for p in NS.path(data_dir).rglob("*") if p.is_file()
    )


def test_a_message_without_an_id_or_time_or_with_an_overlong_id_is_refused_and_says_why(
    data_dir: Path,
) -> None:
    writer = Writer(Store(data_dir))
    ts = "2026-06-01T09:00:00Z"
    ops = [
        Record(message={"ts": ts, "text": "没有 id"}),
        Record(message={"id": "om_when", "ts": "昨天", "text": "时间不对"}),
        Record(message={"id": "", "ts": ts, "text": "空 id"}),
        Record(message={"id": "x" * 201, "ts": ts, "text": "太长的 id"}),
        Record(message={"id": "y" * 200, "ts": ts, "text": "刚好 200"}),
    ]
    outcomes = writer.submit(NS, ops)
    assert [(o.op_id, o.status) for o in outcomes] == [
        (op.op_id, s) for op, s in zip(ops, ["rejected:invalid"] * 4 + ["recorded"], strict=True)
    ]
    assert outcomes[0].detail == "bad message: 'id'"
    assert (outcomes[1].detail or "").startswith("bad message: ")
    assert {o.detail for o in outcomes[2:4]} == {"a message needs an id of at most 200 characters"}
    raw = (NS.path(data_dir) / "raw" / "2026-06-01.md").read_text("utf-8")
    assert "刚好 200" in raw and not any(t in raw for t in ("没有 id", "时间不对", "空 id", "太长的 id"))


def test_a_message_recorded_again_in_a_batch_or_beside_another_days_message_is_not_recorded_twice(
    data_dir: Path,
) -> None:
    writer = Writer(Store(data_dir))
    again = {"id": "om_again", "ts": "2026-06-02T09:00:00Z", "text": "第二天的消息"}
    writer.submit(NS, [Record(message=again)])
    other_day = {"id": "om_other", "ts": "2026-06-01T09:00:00Z", "text": "第一天的消息"}
    ops = [Record(message=other_day), Record(message=again), Record(message=other_day)]
    outcomes = writer.submit(NS, ops)
    assert outcomes == [
        Outcome(ops[0].op_id, "recorded", id="om_other"),
        Outcome(ops[1].op_id, "unchanged", id="om_again", detail="already recorded"),
        Outcome(ops[2].op_id, "unchanged", id="om_other", detail="already recorded"),  # twice in one batch
    ]
    raw = NS.path(data_dir) / "raw"
    assert (raw / "2026-06-02.md").read_text("utf-8").count("第二天的消息") == 1
    assert (raw / "2026-06-01.md").read_text("utf-8").count("第一天的消息") == 1


def test_without_redis_a_secret_in_the_speaker_field_is_redacted_too(data_dir: Path) -> None:
    writer = Writer(Store(data_dir))
    message = {"id": "om_secret_2", "ts": "2026-06-01T09:00:00Z", "speaker": f"密码 {SECRET}", "text": "你好"}
    writer.submit(NS, [Record(message=message)])
    raw = (NS.path(data_dir) / "raw" / "2026-06-01.md").read_text("utf-8")
    assert SECRET not in raw and "你好" in raw
    assert SECRET not in _git_log(data_dir)


@pytest.mark.parametrize(
    "inside",
    ["../elsewhere/MEMORY.md", "t1/../../elsewhere/MEMORY.md", "t1/u1/../../../x"],
)
def test_a_path_that_leaves_the_data_directory_is_refused_before_any_open(
    data_dir: Path, inside: str
) -> None:
    """The lexical rule under every open: nothing outside the data directory is read or written, whatever
    the path's spelling (`..` inside it, a sibling folder whose name starts like the data directory's)."""
    from memory_core.errors import UnsafePath
    from memory_core.store import no_symlink, open_beneath

    data_dir.mkdir(parents=True, exist_ok=True)
    outside = data_dir.parent / (data_dir.name + "-sibling") / "MEMORY.md"
    outside.parent.mkdir(exist_ok=True)
    outside.write_text("not ours", "utf-8")
    for path in (data_dir / inside, outside, Path("/") / "etc" / "passwd"):
        with pytest.raises(UnsafePath):
            no_symlink(data_dir, path)
        with pytest.raises(UnsafePath):
            open_beneath(data_dir, path)
    assert no_symlink(data_dir, data_dir / "t1" / "u1") == data_dir / "t1" / "u1"  # below it: fine
