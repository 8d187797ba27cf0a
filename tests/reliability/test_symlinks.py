"""Issue 15 (6): a symbolic link inside a namespace is reported and refused, never followed.

A person with write access to the data directory (or a careless restore) can leave a link where Lucid
keeps a file or a folder: `raw/`, `MEMORY.md`, `.vault/secrets.enc`, `.index/`, the namespace folders, the
writer's `.lucid/` and `.git/`. Each case plants one pointing outside the data directory, then runs the write
or read a person would run. What must hold: a clear error naming the link, nothing written to (or read
from) the target, and the namespace's own files unchanged.
"""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memory_core.errors import UnsafePath
from memory_core.lineformat import RawMessage
from memory_core.namespace import Namespace
from memory_core.ops import Record, Remember, message_to_json
from memory_core.store import Store, atomic_write, open_beneath, read_beneath
from memory_core.vault import derive_key
from memory_core.writer import Writer
from tests.reliability.harness import lucid_cli

NS = Namespace.of("t", "u", "p")
WHEN = datetime(2026, 6, 1, 9, tzinfo=UTC)


def _message(i: int, text: str = "今天去西湖散步") -> Record:
    return Record(message_to_json(RawMessage(f"om_{i}", WHEN, "u", text, "oc_1")))


def _outside_tree(outside: Path) -> dict[str, bytes]:
    return {str(p.relative_to(outside)): p.read_bytes() for p in sorted(outside.rglob("*")) if p.is_file()}


def _seeded(data: Path) -> Writer:
    writer = Writer(Store(data), vault_key=derive_key("k" * 32))
    assert [o.status for o in writer.submit(NS, [Remember("我住在杭州"), _message(0)])] == [
        "added",
        "recorded",
    ]
    return writer


def _plant(link: Path, outside: Path, as_dir: bool) -> None:
    """Replace `link` (a file or folder Lucid made) by a link to `outside`/<same name>."""
    dest = outside / link.name
    if link.exists():
        link.rename(dest)
    elif as_dir:
        dest.mkdir(parents=True)
    else:
        dest.write_bytes(b"")
    os.symlink(dest, link, target_is_directory=as_dir)


CASES = {
    "raw dir": ("raw", True, lambda w: w.submit(NS, [_message(1)])),
    "MEMORY.md": ("MEMORY.md", False, lambda w: w.submit(NS, [Remember("我喜欢喝龙井")])),
    "vault file": (".vault/secrets.enc", False, lambda w: w.submit(NS, [Remember("我的密码是 hunter22")])),
    "vault dir": (".vault", True, lambda w: w.submit(NS, [Remember("我的密码是 hunter22")])),
    "writer state": (".lucid", True, lambda w: w.submit(NS, [Remember("我喜欢喝龙井")])),
    "git dir": (".git", True, lambda w: w.submit(NS, [Remember("我喜欢喝龙井")])),
    "persona dir": ("", True, lambda w: w.submit(NS, [Remember("我喜欢喝龙井")])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_planted_link_is_refused_and_nothing_lands_outside(tmp_path: Path, case: str) -> None:
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    writer = _seeded(data)
    name, as_dir, act = CASES[case]
    root = NS.path(data)
    if case == "vault file":  # the vault exists once a secret was sealed
        writer.submit(NS, [Remember("我的密码是 hunter11")])
    link = root / name if name else root
    _plant(link, outside, as_dir)
    before = _outside_tree(outside)
    with pytest.raises(UnsafePath, match="symbolic link"):
        act(writer)
    assert _outside_tree(outside) == before  # nothing written, appended or replaced through the link


# The file each case's link sits on (or above): what a read, a replace or an append would open there.
BENEATH = {
    "raw dir": "raw/2026-06-01.md",
    "MEMORY.md": "MEMORY.md",
    "vault file": ".vault/secrets.enc",
    "vault dir": ".vault/secrets.enc",
    "writer state": ".lucid/written.json",
    "git dir": ".git/HEAD",
    "persona dir": "MEMORY.md",
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_open_itself_refuses_a_link_planted_after_any_check(tmp_path: Path, case: str) -> None:
    """No check-then-open window: the low-level open (`open_beneath`, under every read and write of the
    store) is called directly here, with no `Store.file()` check before it, as if the link had been planted
    between a check and the open. A read, an atomic replace and an append are each refused by the open
    itself, and nothing outside changes; a plain open of the same path does go through the link."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    writer = _seeded(data)
    writer.submit(NS, [Remember("我的密码是 hunter11")])  # the vault exists
    name, as_dir, _ = CASES[case]
    root = NS.path(data)
    link = root / name if name else root
    _plant(link, outside, as_dir)
    target = root / BENEATH[case]
    assert target.exists()  # the path resolves through the link: an unguarded open would follow it
    before = _outside_tree(outside)
    with pytest.raises(UnsafePath, match="symbolic link"):
        read_beneath(data, target)
    with pytest.raises(UnsafePath, match="symbolic link"):
        atomic_write(data, target, b"replaced through a link")
    with pytest.raises(UnsafePath, match="symbolic link"):
        os.close(open_beneath(data, target, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
    assert _outside_tree(outside) == before
    assert not list(target.parent.glob(".*.tmp"))  # no temp file left behind either


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
@pytest.mark.parametrize("name", ["MEMORY.md", "raw", ""], ids=["MEMORY.md", "raw dir", "persona dir"])
def test_a_link_to_another_persons_files_inside_the_data_directory_is_refused(
    tmp_path: Path, name: str, relative: bool
) -> None:
    """A link that stays inside the data directory is no safer: alice's MEMORY.md (or folder) pointing at
    bob's would hand bob's memory to alice's prompt and alice's writes to bob's file."""
    data = tmp_path / "data"
    writer = _seeded(data)
    bob = Namespace.of("t", "bob", "p")
    writer.submit(bob, [Remember("我对花生过敏"), _message(7, "bob 的私事")])
    root, theirs = NS.path(data), bob.path(data)
    link = root / name if name else root
    shutil.rmtree(link) if link.is_dir() else link.unlink()
    dest = theirs / name if name else theirs
    os.symlink(os.path.relpath(dest, link.parent) if relative else dest, link)
    before = {p: p.read_bytes() for p in sorted(theirs.rglob("*")) if p.is_file() and ".git" not in p.parts}
    opened = root / (name or "MEMORY.md") / ("2026-06-01.md" if name == "raw" else "")
    with pytest.raises(UnsafePath, match="symbolic link"):
        read_beneath(data, Path(os.path.normpath(opened)))
    with pytest.raises(UnsafePath, match="symbolic link"):
        writer.submit(NS, [Remember("我喜欢喝龙井"), _message(8)])
    after = {p: p.read_bytes() for p in sorted(theirs.rglob("*")) if p.is_file() and ".git" not in p.parts}
    assert after == before


# Where the append path, the writer's record, the journal and the raw-index cache open files: (link, is a
# folder, the file opened there).
LATER = {
    "day file (appended)": ("raw/2026-06-01.md", False, "raw/2026-06-01.md"),
    "MEMORY.md (appended)": ("MEMORY.md", False, "MEMORY.md"),
    "written.json": (".lucid/written.json", False, ".lucid/written.json"),
    "journal": (".lucid/journal.json", False, ".lucid/journal.json"),
    "index dir": (".index", True, ".index/raw/manifest.json"),
    "cache dir": (".index/raw", True, ".index/raw/manifest.json"),
    "cache manifest": (".index/raw/manifest.json", False, ".index/raw/manifest.json"),
    "cache generation": ("GEN", True, "GEN/part.json"),
}


@pytest.mark.parametrize("case", list(LATER))
def test_appends_bookkeeping_and_the_cache_refuse_a_link_at_the_open(tmp_path: Path, case: str) -> None:
    """The same, for the opens the append path, `written.json`, the journal and `save_cache`'s folders and
    manifest make: a read, a replace, an append and a truncating write are refused by the open itself."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    store = Store(data)
    writer = _seeded(data)
    writer.submit(NS, [_message(1), Remember("我喜欢喝龙井")])  # appended, journalled
    store.write_journal(NS, {"batch": "b"})
    store.save_cache(NS, "raw", {"part.json": b"{}"}, {"v": 1})
    held = store.load_cache(NS, "raw")
    assert held is not None
    gen = f".index/raw/{held[0]['generation']}"
    name, as_dir, opened = LATER[case]
    root = NS.path(data)
    _plant(root / name.replace("GEN", gen), outside, as_dir)
    target = root / opened.replace("GEN", gen)
    assert target.exists()
    before = _outside_tree(outside)
    with pytest.raises(UnsafePath, match="symbolic link"):
        read_beneath(data, target)
    with pytest.raises(UnsafePath, match="symbolic link"):
        atomic_write(data, target, b"replaced through a link")
    for flags in (os.O_WRONLY | os.O_APPEND, os.O_WRONLY | os.O_TRUNC | os.O_CREAT):
        with pytest.raises(UnsafePath, match="symbolic link"):
            os.close(open_beneath(data, target, flags))
    assert _outside_tree(outside) == before
    assert not list(target.parent.glob(".*.tmp"))


def test_search_through_a_linked_index_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    _seeded(data)
    os.symlink(outside, NS.path(data) / ".index", target_is_directory=True)
    out = lucid_cli(data, "search", "西湖", "--tenant", "t", "--user", "u", "--persona", "p", check=False)
    assert out.returncode != 0
    assert "symbolic link" in out.stderr and "Traceback" not in out.stderr
    assert list(outside.iterdir()) == []


def test_a_linked_day_file_is_not_read_into_search(tmp_path: Path) -> None:
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    _seeded(data)
    foreign = outside / "2026-06-02.md"
    foreign.write_text("# Messages\n\n- 别人的私事 <!--r:id=x;ts=2026-06-02T00:00:00Z;sp=v-->\n")
    os.symlink(foreign, NS.path(data) / "raw" / "2026-06-02.md")
    out = lucid_cli(data, "search", "私事", "--tenant", "t", "--user", "u", "--persona", "p", check=False)
    assert "别人的私事" not in out.stdout
    assert out.returncode != 0 and "symbolic link" in out.stderr


def test_doctor_lists_the_links_before_a_write_trips_on_one(tmp_path: Path) -> None:
    from bot import doctor
    from workers.settings import Settings

    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    _seeded(data)
    assert doctor.check_links(Settings(data_dir=data)).ok
    os.symlink(outside, NS.path(data) / "raw-elsewhere", target_is_directory=True)
    check = doctor.check_links(Settings(data_dir=data))
    assert not check.ok and "raw-elsewhere" in check.detail and "replace" in check.fix


async def test_the_viewer_reports_a_linked_namespace_instead_of_failing(
    aiohttp_client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from aiohttp import web

    from bot import viewer
    from workers.runtime import build
    from workers.settings import Settings

    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    _seeded(data)
    _plant(NS.path(data) / "MEMORY.md", outside, as_dir=False)
    app = web.Application()
    viewer.mount(app, build(Settings(data_dir=data, admin_token="t" * 32, config_path=data / "none.toml")))
    client = await aiohttp_client(app)
    auth = {"Authorization": "Bearer " + "t" * 32}
    listing = await client.get("/admin/api/namespaces", headers=auth)
    assert listing.status == 200
    [row] = (await listing.json())["namespaces"]
    assert "symbolic link" in row["error"]
    one = await client.get("/admin/api/ns/t/u/p", headers=auth)
    assert one.status == 409 and "symbolic link" in (await one.json())["error"]


def test_the_raw_index_reads_a_day_file_by_an_open_that_refuses_a_link(tmp_path: Path) -> None:
    """Raw search reads only what was appended to a day file since it last looked: that read, too, is an
    open that follows no link (no check before it to race)."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    writer = _seeded(data)
    writer.submit(NS, [_message(1)])
    store = Store(data)
    day = store.raw_days(NS)[0]
    size, whole = store.read_raw_from(NS, day, 0)
    assert size == len(whole) and b"\n- " in whole
    assert store.read_raw_from(NS, day, size) == (size, b"")
    foreign = outside / day
    foreign.write_bytes(whole + "- 别人的私事 <!--r:id=x;ts=2026-06-01T00:00:00Z;sp=v-->\n".encode())
    (NS.path(data) / "raw" / day).unlink()
    os.symlink(foreign, NS.path(data) / "raw" / day)
    with pytest.raises(UnsafePath, match="symbolic link"):
        store.read_raw_from(NS, day, size)


@pytest.mark.parametrize("planted", [".lucid/writer.lock", ".lucid"])
def test_the_host_local_writer_lock_is_opened_without_following_a_link(tmp_path: Path, planted: str) -> None:
    """The lock file `lucid` takes without Redis: a link in its place (or its folder's) is refused by the
    open itself, and a write through the writer fails saying so, with nothing created outside."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    writer = _seeded(data)
    link = NS.path(data) / planted
    if link.is_dir():
        shutil.rmtree(link)
    else:
        link.unlink()
    target = outside / "writer.lock"
    if planted == ".lucid":
        os.symlink(outside, link, target_is_directory=True)
    else:
        os.symlink(target, link)
    with pytest.raises(UnsafePath, match="symbolic link"):
        os.close(Store(data).open_lock(NS))
    with pytest.raises(UnsafePath, match="symbolic link"):
        writer.submit(NS, [Remember("我喜欢喝龙井")])
    assert list(outside.iterdir()) == []
