"""A power cut: libgit2 syncs none of the loose objects, the index or the skeleton it writes, so after one they
can be empty or cut short, and libgit2 never returns from reading a cut object (libgit2#7342). The memory
files are synced and whole. The next write must still land, git must read, and history must keep what the
packs (synced) and the files still hold. Every git step runs in a process of its own with a timeout: a
writer or reader that hangs fails the test instead of stalling the suite."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from memory_core.lineformat import parse_file
from memory_core.namespace import Namespace
from memory_core.ops import Remember
from memory_core.store import MEMORY, Store
from memory_core.writer import Writer
from tests.reliability.harness import ROOT

NS = Namespace.of("t", "power", "p")

_STEP = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memory_core.errors import StoreError
    from memory_core.namespace import Namespace
    from memory_core.ops import Remember
    from memory_core.store import Store
    from memory_core.writer import Writer
    data, ns, what = Path(sys.argv[1]), Namespace.parse(sys.argv[2]), sys.argv[3]
    if what == "history":
        try:
            print(len(Store(data).history(ns)))
        except StoreError as exc:
            print("refused:", exc)
    else:
        print(Writer(Store(data)).submit(ns, [Remember(text=what)])[0].status)
    """
)


def _step(data: Path, what: str) -> str:
    """`history` (a reader) or a text to remember (the next writer), in a fresh process, after the cut."""
    out = subprocess.run(
        [sys.executable, "-c", _STEP, str(data), str(NS), what],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
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
    written = root / ".lucid" / "written.json"
    record = json.loads(written.read_text())
    assert record["boot"]  # the boot the last commit was made in
    written.write_text(json.dumps({**record, "boot": "a boot before the power cut"}))

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
