"""The store's packing on a real repository: a small namespace is repacked whole into one pack at each
packing; past REPACK_ALL_BYTES of packs (1 MB) only the loose objects are packed, the big pack left as it is
(same file, same inode), and at PACKS_MAX packs all but the largest merge. The history stays readable and
`.git` stays within a small multiple of the data either way."""

from __future__ import annotations

import base64
import random
import subprocess
from collections.abc import Callable
from pathlib import Path

from memory_core.namespace import Namespace
from memory_core.store import MEMORY, PACKS_MAX, PROFILE, REPACK_ALL_BYTES, Store

NS = Namespace.of("t1", "u1", "default")
BIG = 350_000  # characters of random base64 per big commit: zlib cannot shrink it much


def _packs(root: Path) -> dict[str, tuple[int, int]]:
    """The repository's packs: name → (inode, size)."""
    out = {}
    for p in (root / ".git" / "objects" / "pack").glob("pack-*.pack"):
        st = p.stat()
        out[p.name] = (st.st_ino, st.st_size)
    return out


def _loose(root: Path) -> int:
    objects = root / ".git" / "objects"
    return sum(1 for d in objects.iterdir() if len(d.name) == 2 for _ in d.iterdir())


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


class _Namespace:
    """A namespace committed through the store, remembering what each commit held."""

    def __init__(self, data_dir: Path) -> None:
        self.store = Store(data_dir)
        self.store.ensure_repo(NS)
        self.root = NS.path(data_dir)
        self.rng = random.Random(13)
        self.versions: dict[str, dict[str, str]] = {}  # rev → the tracked files as committed
        self.written = 0  # bytes of every version written

    def small(self) -> dict[str, str]:
        return {PROFILE: f"# Profile\n\n- 第{len(self.versions)}次: {self.rng.random()}\n"}

    def big(self) -> dict[str, str]:
        raw = base64.encodebytes(self.rng.randbytes(BIG * 3 // 4)).decode()
        return {MEMORY: "# Memory\n\n" + raw}

    def commit(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            (self.root / name).write_text(text, "utf-8")
            self.written += len(text.encode())
        rev = self.store.commit(NS, f"commit {len(self.versions)}")
        assert rev is not None
        full = self.store.resolve(NS, rev)
        names = [n for n in (MEMORY, PROFILE) if (self.root / n).exists()]
        self.versions[full] = {n: (self.root / n).read_text("utf-8") for n in names}

    def until_packed(self, make: Callable[[], dict[str, str]]) -> None:
        """Commit until a packing happened (no loose object left after a commit)."""
        for _ in range(200):
            self.commit(make())
            if _loose(self.root) == 0:
                return
        raise AssertionError("200 commits and never packed")


def test_past_1_mb_only_loose_objects_are_packed_and_the_big_pack_stays(data_dir: Path) -> None:
    ns = _Namespace(data_dir)
    # Small: each packing repacks everything into one new pack (the old one goes).
    ns.until_packed(ns.small)
    first = _packs(ns.root)
    assert len(first) == 1
    ns.until_packed(ns.small)
    second = _packs(ns.root)
    assert len(second) == 1 and second.keys() != first.keys()  # repacked whole, not added to
    # Big: random text until the one pack passes 1 MB.
    for _ in range(10):
        ns.until_packed(ns.big)
        packs = _packs(ns.root)
        assert len(packs) == 1  # still repacked whole while the packs were under 1 MB
        (big, (inode, size)), *_ = packs.items()
        if size > REPACK_ALL_BYTES:
            break
    assert size > REPACK_ALL_BYTES
    # Past 1 MB: each packing adds one pack of the loose objects; the big pack is the same file.
    for n in range(2, PACKS_MAX):
        ns.until_packed(ns.small)
        packs = _packs(ns.root)
        assert len(packs) == n and packs[big] == (inode, size), (n, packs)
    # At PACKS_MAX packs all but the largest merge into one: two packs, the big one untouched.
    ns.until_packed(ns.small)
    packs = _packs(ns.root)
    assert len(packs) == 2 and packs[big] == (inode, size), packs
    assert max(s for _, s in packs.values()) == size
    # Every commit is still readable, as committed; git agrees the repository is whole.
    history = [r["rev"] for r in ns.store.history(NS, limit=10_000)]
    assert sorted(history) == sorted(ns.versions)
    for rev, files in ns.versions.items():
        at = ns.store.files_at(NS, rev)
        assert {n: at[n] for n in files} == files
    _git(ns.root, "fsck", "--strict", "--no-dangling")
    assert "packs: 2" in _git(ns.root, "count-objects", "-v")
    git_bytes = sum(p.stat().st_size for p in (ns.root / ".git").rglob("*") if p.is_file())
    assert git_bytes <= 2 * ns.written, (git_bytes, ns.written)
