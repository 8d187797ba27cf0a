"""A power cut: libgit2 syncs none of the loose objects, the index or the skeleton it writes, so after one they
can be empty or cut short, and libgit2 never returns from reading a cut object (libgit2#7342). The memory
files are synced and whole. The next write must still land, git must read, and history must keep what the
packs (synced) and the files still hold. Every git step runs in a process of its own with a timeout: a
writer or reader that hangs fails the test instead of stalling the suite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memory_core.lineformat import RawMessage, parse_file
from memory_core.namespace import Namespace
from memory_core.ops import Forget, Record, Remember, message_to_json
from memory_core.store import MEMORY, Store
from memory_core.writer import Writer
from tests.reliability.harness import ROOT, lucid_cli

NS = Namespace.of("t", "power", "p")

_STEP = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memory_core.errors import StoreError
    from memory_core.namespace import Namespace
    from datetime import UTC, datetime
    from memory_core.lineformat import RawMessage
    from memory_core.ops import Record, Remember, message_to_json
    from memory_core.store import Store
    from memory_core.writer import Writer
    data, ns, what = Path(sys.argv[1]), Namespace.parse(sys.argv[2]), sys.argv[3]
    if what == "record":  # with LUCID_KILL_POINT=append: killed halfway through appending the line
        message = RawMessage("om_torn", datetime(2026, 12, 5, 11, tzinfo=UTC), "u", "撕裂的消息", "oc_1")
        Writer(Store(data)).submit(ns, [Record(message=message_to_json(message))])
    elif what == "history":
        try:
            print(len(Store(data).history(ns)))
        except StoreError as exc:
            print("refused:", exc)
    else:
        print(Writer(Store(data)).submit(ns, [Remember(text=what)])[0].status)
    """
)


def _step(data: Path, what: str, kill: str = "") -> str:
    """`history` (a reader) or a text to remember (the next writer), in a fresh process, after the cut;
    `record` with `kill`: a writer killed at that kill point."""
    out = subprocess.run(
        [sys.executable, "-c", _STEP, str(data), str(NS), what],
        cwd=ROOT,
        env={**os.environ, "LUCID_KILL_POINT": kill} if kill else None,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == (-signal.SIGKILL if kill else 0), out.stderr[-2000:]
    return out.stdout.strip()


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=120)


def _loose(root: Path) -> list[Path]:
    return sorted((root / ".git" / "objects").glob("??/" + "?" * 38))


def _cut(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(b"" if how == "empty" else data[: len(data) // 2])


def _remembered(root: Path) -> Counter[str]:
    return Counter(e.text for e in parse_file((root / MEMORY).read_text("utf-8")).entries())


def _another_boot(root: Path) -> None:
    """`written.json` as a restart finds it: recorded in the boot before."""
    written = root / ".lucid" / "written.json"
    record = json.loads(written.read_text())
    assert record["boot"]  # the boot the last commit was made in
    written.write_text(json.dumps({**record, "boot": "a boot before the power cut"}))


def _object(root: Path, rev: str) -> Path:
    oid = git(root, "rev-parse", rev).stdout.strip()
    return root / ".git" / "objects" / oid[:2] / oid[2:]


def _whole_and_clean(root: Path) -> None:
    fsck = git(root, "fsck", "--strict", "--no-dangling")
    assert fsck.returncode == 0, fsck.stderr
    assert git(root, "status", "--porcelain").stdout == ""
    assert git(root, "show", "HEAD:MEMORY.md").stdout == (root / MEMORY).read_text("utf-8")


@pytest.mark.parametrize("how", ["empty", "cut"])
def test_after_a_power_cut_that_cut_every_loose_object_the_next_write_lands_and_history_keeps_the_packs(
    how: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    writer = Writer(Store(data))
    texts = [f"停电前记下的第{i}件事" for i in range(43)]
    for (
        text
    ) in texts:  # enough commits to be packed as the namespace grew, and a few loose after the last pack
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    loose = _loose(root)
    assert loose  # the newest commits are loose: what a power cut can cut
    ids = {p.parent.name + p.name for p in loose}
    history = git(root, "log", "--format=%H").stdout.split()
    newest_packed = next(h for h in history if h not in ids)
    for path in loose:
        _cut(path, how)
    _cut(root / ".git" / "index", how)
    (root / ".lucid" / "written.json").unlink()  # never synced: lost too

    # A reader says what is wrong instead of hanging; it changes nothing.
    assert _step(data, "history").startswith("refused: the git history of t/power/p has")
    assert _step(data, "停电后的第一件事") == "added"

    assert _remembered(root) == Counter([*texts, "停电后的第一件事"])  # nothing acknowledged is lost
    _whole_and_clean(root)
    assert git(root, "merge-base", "--is-ancestor", newest_packed, "HEAD").returncode == 0
    assert int(_step(data, "history")) >= len(history) - len(ids)
    assert _step(data, "再下一件事") == "added"  # and it stays writable
    _whole_and_clean(root)


def test_a_cut_object_the_files_still_hold_is_written_again_after_a_restart_and_no_commit_is_lost(
    tmp_path: Path,
) -> None:
    """HEAD's MEMORY.md blob is cut; the file on disk holds the same bytes, so nothing of history is lost.
    Nothing fails loudly here: without the check at the first write after a boot, the next commits would
    reference the cut blob and `git fsck` would find the history corrupt."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    for text in ("我在杭州西湖区上班", "我喜欢喝咖啡", "我养了一只猫"):
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    head = git(root, "rev-parse", "HEAD").stdout.strip()
    blob = git(root, "rev-parse", "HEAD:MEMORY.md").stdout.strip()
    _cut(root / ".git" / "objects" / blob[:2] / blob[2:], "cut")
    _another_boot(root)

    assert _step(data, "我女儿今年五岁") == "added"

    _whole_and_clean(root)
    assert git(root, "merge-base", "--is-ancestor", head, "HEAD").returncode == 0  # every commit kept
    assert git(root, "log", "--format=%s").stdout.splitlines() == ["memory: 1 added"] * 4


def test_a_namespace_made_just_before_the_power_cut_is_written_to_again(tmp_path: Path) -> None:
    """Its skeleton (HEAD, config) was never synced either."""
    data = tmp_path / "data"
    assert Writer(Store(data)).submit(NS, [Remember(text="新来的人说的第一件事")])[0].status == "added"
    root = NS.path(data)
    for path in [*_loose(root), root / ".git" / "HEAD", root / ".git" / "config", root / ".git" / "index"]:
        _cut(path, "empty")
    (root / ".lucid" / "written.json").unlink()

    assert _step(data, "停电后的第一件事") == "added"

    assert _remembered(root) == Counter(["新来的人说的第一件事", "停电后的第一件事"])
    _whole_and_clean(root)
    assert git(root, "symbolic-ref", "HEAD").stdout == "refs/heads/main\n"


def test_an_index_cut_alone_is_dropped_and_no_commit_is_lost(tmp_path: Path) -> None:
    """The objects reached the disk, the index written after them did not: the files then read as a hand
    edit, whose commit reads the index."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    for text in ("我在杭州西湖区上班", "我喜欢喝咖啡"):
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    head = git(root, "rev-parse", "HEAD").stdout.strip()
    _cut(root / ".git" / "index", "cut")
    (root / ".lucid" / "written.json").unlink()

    assert _step(data, "我养了一只猫") == "added"

    _whole_and_clean(root)
    assert git(root, "merge-base", "--is-ancestor", head, "HEAD").returncode == 0


@pytest.mark.parametrize("rev", ["HEAD~1:MEMORY.md", "HEAD~1"])
def test_an_object_cut_inside_history_moves_the_branch_behind_it_and_history_reads(
    rev: str, tmp_path: Path
) -> None:
    """Cut below HEAD (a blob no file holds any more, or a commit): HEAD's own objects are there, but its
    history is not whole; the branch goes back before the cut and the files are committed on it."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    texts = ["我在杭州西湖区上班", "我喜欢喝咖啡", "我养了一只猫", "我女儿今年五岁"]
    for text in texts:
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    kept = git(root, "rev-parse", "HEAD~2").stdout.strip()
    _cut(_object(root, rev), "cut")
    _another_boot(root)

    assert _step(data, "我老婆是老师") == "added"

    assert _remembered(root) == Counter([*texts, "我老婆是老师"])
    _whole_and_clean(root)
    assert int(_step(data, "history")) >= 3  # read, not refused or failed
    assert git(root, "merge-base", "--is-ancestor", kept, "HEAD").returncode == 0


def test_the_raw_days_of_the_commits_lost_are_committed_again(tmp_path: Path) -> None:
    """A batch's commit names only its own raw days: when the branch moves back, every file is committed as
    it is, or a day's messages would stay uncommitted (and a purge's hard reset would take them)."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    when = datetime(2026, 12, 5, 10, tzinfo=UTC)
    for i, text in enumerate(["我在杭州西湖区上班", "我喜欢喝咖啡"]):
        message = Record(message=message_to_json(RawMessage(f"om_{i}", when, "u", f"第{i}条消息", "oc_1")))
        assert [o.status for o in writer.submit(NS, [message, Remember(text=text)])] == ["recorded", "added"]
    root = NS.path(data)
    _cut(_object(root, "HEAD"), "cut")
    _another_boot(root)

    assert _step(data, "我养了一只猫") == "added"

    _whole_and_clean(root)
    day = root / "raw" / "2026-12-05.md"
    assert git(root, "show", "HEAD:raw/2026-12-05.md").stdout == day.read_text("utf-8")
    assert "om_1" in day.read_text("utf-8")


def test_a_mend_that_died_after_dropping_the_cut_objects_is_finished_by_the_next(tmp_path: Path) -> None:
    """The cut objects are gone (dropped) but the branch still names one of them."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    for text in ("我在杭州西湖区上班", "我喜欢喝咖啡"):
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    _object(root, "HEAD").unlink()
    _another_boot(root)

    assert _step(data, "我养了一只猫") == "added"

    assert _remembered(root) == Counter(["我在杭州西湖区上班", "我喜欢喝咖啡", "我养了一只猫"])
    _whole_and_clean(root)


def test_the_branch_goes_back_to_the_deepest_whole_line_not_to_the_latest_dated_commit(
    tmp_path: Path,
) -> None:
    """A commit nothing descends from (a fold amends HEAD and leaves the commit it replaced), dated later
    than the main line as a clock wrong after a boot dates it: HEAD's commit cut, the branch goes back to
    the main line's newest whole commit, not to that older state."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    for text in ("我在杭州西湖区上班", "我喜欢喝咖啡", "我养了一只猫", "我女儿今年五岁"):
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    when = "2030-01-01T00:00:00+00:00"
    who = {"GIT_AUTHOR_NAME": "Lucid", "GIT_AUTHOR_EMAIL": "lucid@localhost", "GIT_AUTHOR_DATE": when}
    env = {**os.environ, **who, "GIT_COMMITTER_NAME": "Lucid", "GIT_COMMITTER_EMAIL": "lucid@localhost"}
    aside = subprocess.run(
        ["git", "-C", str(root), "commit-tree", "HEAD~3^{tree}", "-p", "HEAD~3", "-m", "memory: 1 recorded"],
        env={**env, "GIT_COMMITTER_DATE": when},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    keep = git(root, "rev-parse", "HEAD~1").stdout.strip()
    _cut(_object(root, "HEAD"), "cut")
    _another_boot(root)

    assert _step(data, "我老婆是老师") == "added"

    _whole_and_clean(root)
    assert git(root, "merge-base", "--is-ancestor", keep, "HEAD").returncode == 0
    assert git(root, "merge-base", "--is-ancestor", aside, "HEAD").returncode == 1


def test_a_hand_edit_made_before_the_cut_is_redacted_not_committed_as_it_stands(tmp_path: Path) -> None:
    """The files are committed on the branch the mend moved, but one edited by hand keeps the branch's
    version: the writer's hand-edit path redacts its secret and counts the deleted line as forgotten."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    for text in ("我在杭州西湖区上班", "我喜欢喝咖啡", "我养了一只猫"):
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    memory = root / MEMORY
    secret = "sk-proj-Zq8xW3vB7nK2mT9pL4rY6hJ1cF5dG0sA"
    kept = [line for line in memory.read_text("utf-8").split("\n") if "咖啡" not in line]
    memory.write_text("\n".join(kept).rstrip("\n") + f"\n\nmy key {secret}\n", "utf-8")
    _cut(_object(root, "HEAD"), "cut")
    _another_boot(root)

    assert _step(data, "我女儿今年五岁") == "added"

    _whole_and_clean(root)
    assert secret not in git(root, "log", "-p", "--all").stdout
    assert secret not in memory.read_text("utf-8") and "咖啡" not in memory.read_text("utf-8")
    assert json.loads((root / ".lucid" / "state.json").read_text()).get("forgets") == 1


def test_a_ref_whose_last_move_was_lost_gets_the_files_committed_on_it(tmp_path: Path) -> None:
    """Nothing is cut, but the branch names an older whole commit (its last rename did not reach the disk,
    or a mend died before its commit): the raw days written since are committed, not left behind."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    when = datetime(2026, 12, 5, 10, tzinfo=UTC)
    for i in range(2):
        message = Record(message=message_to_json(RawMessage(f"om_{i}", when, "u", f"第{i}条消息", "oc_1")))
        assert writer.submit(NS, [message])[0].status == "recorded"
        assert writer.submit(NS, [Remember(text=f"第{i}件事")])[0].status == "added"
    root = NS.path(data)
    (root / ".git" / "refs" / "heads" / "main").write_text(git(root, "rev-parse", "HEAD~1").stdout)
    _another_boot(root)

    assert _step(data, "我养了一只猫") == "added"

    _whole_and_clean(root)
    assert git(root, "show", "HEAD:raw/2026-12-05.md").stdout == (root / "raw" / "2026-12-05.md").read_text()


@pytest.mark.parametrize("how", ["empty", "cut"])
@pytest.mark.parametrize("reader_first", [False, True])
def test_a_branch_ref_the_power_cut_emptied_or_cut_is_mended_and_no_commit_is_lost(
    how: str, reader_first: bool, tmp_path: Path
) -> None:
    """The ref is written without a sync (the objects it names are not synced either: the mend after the boot
    is what makes git whole). Emptied or cut in half, the next command, a write or `lucid history`, finds the
    commit it named again and goes on from it."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    for text in ("我在杭州西湖区上班", "我喜欢喝咖啡", "我养了一只猫"):
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    head = git(root, "rev-parse", "HEAD").stdout.strip()
    _cut(root / ".git" / "refs" / "heads" / "main", how)
    _another_boot(root)

    if reader_first:
        shown = lucid_cli(data, "history", "--json", "--tenant", "t", "--user", "power", "--persona", "p")
        assert len(json.loads(shown.stdout)["results"]) == 3
    assert _step(data, "我女儿今年五岁") == "added"

    _whole_and_clean(root)
    assert git(root, "rev-parse", "HEAD~1").stdout.strip() == head  # every commit kept, the new one on top


def test_the_branch_moves_a_power_cut_lost_are_found_again_and_no_commit_drops_out_of_history(
    tmp_path: Path,
) -> None:
    """The ref is not synced: after the cut it names a commit two moves back, though the commits made since
    are whole. The branch goes on from the newest of them, not from where the ref was left."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    for text in ("我在杭州西湖区上班", "我喜欢喝咖啡", "我养了一只猫"):
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    history = git(root, "log", "--format=%H").stdout.split()
    (root / ".git" / "refs" / "heads" / "main").write_text(history[2] + "\n")
    _another_boot(root)

    assert _step(data, "我女儿今年五岁") == "added"

    _whole_and_clean(root)
    assert git(root, "log", "--format=%H").stdout.split()[1:] == history  # all three, the new one on top
    assert git(root, "log", "--format=%s").stdout.splitlines() == ["memory: 1 added"] * 4


def test_a_commit_a_fold_amended_away_is_not_taken_for_a_lost_move_of_the_branch(tmp_path: Path) -> None:
    """A recorded message's commit is folded into the next memory's (amended: the first version stays loose,
    whole, beside the branch). The mend after a boot must keep the branch where it is."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    when = datetime(2026, 12, 5, 10, tzinfo=UTC)
    for i in range(2):
        assert writer.submit(NS, [Remember(text=f"第{i}件事")])[0].status == "added"
        message = Record(message=message_to_json(RawMessage(f"om_{i}", when, "u", f"第{i}条消息", "oc_1")))
        assert writer.submit(NS, [message])[0].status == "recorded"
    root = NS.path(data)
    history = git(root, "log", "--format=%H").stdout.split()
    forks = git(root, "fsck", "--unreachable", "--no-reflogs").stdout
    assert "unreachable commit" in forks  # a message's commit, folded into the next memory's (amended)
    _another_boot(root)

    assert _step(data, "我女儿今年五岁") == "added"

    _whole_and_clean(root)
    # on the same line: the new memory folds the last message's commit into its own, as without the boot
    assert git(root, "log", "--format=%H").stdout.split()[1:] == history[1:]
    assert git(root, "show", "HEAD:raw/2026-12-05.md").stdout == (root / "raw" / "2026-12-05.md").read_text()


def test_commits_a_mend_left_behind_are_not_packed_as_whole_for_the_next_power_cut(tmp_path: Path) -> None:
    """Two power cuts with packing between them, in a namespace past `REPACK_ALL_OBJECTS` (packed by adding
    the loose objects, reachable or not): the commits the first mend moved the branch off (their history
    holds a dropped blob, and that line is longer than the one grown since) must not come back as the
    second mend's choice once packed."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    for i in range(88):  # ~270 objects, packed as they come
        assert writer.submit(NS, [Remember(text=f"第一次停电前的第{i}件事")])[0].status == "added"
    for i in range(9):  # each from a fresh process, which packs nothing on its first commit: a loose tail
        assert Writer(Store(data)).submit(NS, [Remember(text=f"尾巴上的第{i}件事")])[0].status == "added"
    root = NS.path(data)
    _cut(_object(root, "HEAD~8:MEMORY.md"), "cut")
    _another_boot(root)
    assert _step(data, "第一次停电后的事") == "added"
    between = Writer(Store(data))  # one process: its fourth commit packs (nothing is cut now)
    packs = set((root / ".git" / "objects" / "pack").glob("pack-*.pack"))
    for i in range(4):
        assert between.submit(NS, [Remember(text=f"两次停电之间的第{i}件事")])[0].status == "added"
    assert set((root / ".git" / "objects" / "pack").glob("pack-*.pack")) - packs
    packed = git(root, "rev-parse", "HEAD").stdout.strip()
    assert between.submit(NS, [Remember(text="第二次停电前的事")])[0].status == "added"  # a loose HEAD
    _cut(_object(root, "HEAD"), "cut")
    _another_boot(root)

    assert _step(data, "第二次停电后的事") == "added"

    _whole_and_clean(root)
    assert git(root, "merge-base", "--is-ancestor", packed, "HEAD").returncode == 0


def test_an_append_the_cut_tore_is_taken_back_before_the_files_are_committed(tmp_path: Path) -> None:
    """Killed halfway through appending a message (what a power cut leaves of an unsynced append), then a
    boot: the torn half line never reaches git, not even in a commit a later one undoes."""
    data = tmp_path / "data"
    when = datetime(2026, 12, 5, 10, tzinfo=UTC)
    message = Record(message=message_to_json(RawMessage("om_0", when, "u", "第一条消息", "oc_1")))
    assert Writer(Store(data)).submit(NS, [message])[0].status == "recorded"
    root = NS.path(data)
    _step(data, "record", kill="append")
    day = root / "raw" / "2026-12-05.md"
    assert "om_torn" in day.read_text("utf-8", errors="replace")  # the torn half is on disk
    _another_boot(root)

    assert _step(data, "我养了一只猫") == "added"

    _whole_and_clean(root)
    assert "om_torn" not in day.read_text("utf-8", errors="replace")
    assert "om_torn" not in git(root, "log", "-p", "--all").stdout


def _cut_head_commit(data: Path) -> Path:
    """Three memories, then a restart finds the newest commit cut short (its files are whole)."""
    writer = Writer(Store(data))
    for text in ("我在杭州西湖区上班", "我喜欢喝咖啡", "我养了一只猫"):
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    _cut(_object(root, "HEAD"), "cut")
    _another_boot(root)
    return root


@pytest.mark.parametrize("first", ["history", "undo"])
def test_the_first_command_after_a_power_cut_reads_history_or_undoes_without_waiting_for_a_write(
    first: str, tmp_path: Path
) -> None:
    """`lucid history` and `lucid undo` take the writer's lease and mend first, as a write would: a person's
    first command after the restart works instead of refusing until the bot next writes."""
    data = tmp_path / "data"
    root = _cut_head_commit(data)
    who = ("--tenant", "t", "--user", "power", "--persona", "p")

    for command in (first, "undo" if first == "history" else "history"):
        if command == "undo":
            lucid_cli(data, "undo", *who)
            assert _remembered(root) == Counter(["我在杭州西湖区上班", "我喜欢喝咖啡"])
        else:
            kinds = [
                r["kind"] for r in json.loads(lucid_cli(data, "history", "--json", *who).stdout)["results"]
            ]
            # the commit the cut lost is committed again; an undo after it is one more row
            assert kinds[-3:] == ["recovered", "memory", "memory"]
        _whole_and_clean(root)


def test_a_purge_of_a_fact_forgotten_before_the_power_cut_rewrites_history_at_once(tmp_path: Path) -> None:
    """The fact is only in git history, so the purge reads history before it writes anything."""
    data = tmp_path / "data"
    writer = Writer(Store(data))
    for text in ("我在杭州西湖区上班", "我喜欢喝咖啡"):
        assert writer.submit(NS, [Remember(text=text)])[0].status == "added"
    root = NS.path(data)
    coffee = next(e.id for e in parse_file((root / MEMORY).read_text("utf-8")).entries() if "咖啡" in e.text)
    assert writer.submit(NS, [Forget(id=coffee)])[0].status == "forgotten"
    _cut(_object(root, "HEAD"), "cut")
    _another_boot(root)

    lucid_cli(data, "forget", "--purge", coffee, "--tenant", "t", "--user", "power", "--persona", "p")

    assert _remembered(root) == Counter(["我在杭州西湖区上班"])
    assert "咖啡" not in git(root, "log", "-p", "--all").stdout
    _whole_and_clean(root)


@pytest.mark.parametrize("reader", ["viewer", "card"])
def test_the_viewer_and_the_admin_card_read_at_once_after_a_power_cut(reader: str, tmp_path: Path) -> None:
    """Both read the dream commits of history; like `lucid history`, they mend first."""
    from bot.viewer import view
    from workers.memory_card import last_dream
    from workers.runtime import build
    from workers.settings import Settings

    data = tmp_path / "data"
    root = _cut_head_commit(data)
    with build(Settings(data_dir=data, config_path=data / "none.toml")) as rt:
        if reader == "viewer":
            shown = view(rt, rt.memory, NS)
            assert "我养了一只猫" in json.dumps(shown, ensure_ascii=False)
        else:
            assert last_dream(rt, NS) is None  # read, and no dream in it
    _whole_and_clean(root)


def test_a_reader_answers_while_a_writer_that_mended_first_holds_the_lease_past_the_readers_wait(
    tmp_path: Path,
) -> None:
    """A batch (a dream's transaction, a leader's tenure) that mended git first may hold the lease longer
    than a reader waits: the reader then reads the git made whole, instead of failing on the lease."""
    import threading

    from memory_core.book import Book
    from memory_core.store import Snapshot

    data = tmp_path / "data"
    _cut_head_commit(data)
    holding, done = threading.Event(), threading.Event()

    def hold(_book: Book, _snap: Snapshot) -> None:
        holding.set()
        assert done.wait(120)

    leader = threading.Thread(target=Writer(Store(data)).transact, args=(NS, hold, "hold"))
    leader.start()
    try:
        assert holding.wait(120)
        reader = Writer(Store(data), lease_wait=0.5)
        reader.mend(NS)  # waited its 0.5 s for the lease in vain
        kinds = [r["message"].split(":")[0] for r in reader.store.history(NS)]
        assert kinds == ["recover after a crash", "memory", "memory"]  # the cut commit, committed again
    finally:
        done.set()
        leader.join(120)


def test_a_readers_mend_is_recorded_so_the_next_process_does_not_check_git_again(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _cut_head_commit(data)
    assert not Store(data).mended(NS)
    lucid_cli(data, "history", "--tenant", "t", "--user", "power", "--persona", "p")
    assert Store(data).mended(NS)  # a new process: `written.json` says this boot checked it


def test_the_admin_card_shows_without_its_undo_button_while_history_cannot_be_read(tmp_path: Path) -> None:
    """Git is cut and another writer holds the lease (so this one cannot mend it yet): the memory card still
    shows, only without the last dream's undo button, instead of failing the card and the reply."""
    from workers.memory_card import last_dream
    from workers.runtime import build
    from workers.settings import Settings

    data = tmp_path / "data"
    _cut_head_commit(data)
    with build(Settings(data_dir=data, config_path=data / "none.toml")) as rt:
        rt.writer.lease_wait = 0.05  # the writer's configured wait, shortened: the holder never lets go
        held = rt.writer.locker.acquire(NS, 1.0, 0)
        assert held is not None
        try:
            assert last_dream(rt, NS) is None
        finally:
            held.release()
        assert Store(data).mended(NS) is False  # nothing was mended behind the holder's back
