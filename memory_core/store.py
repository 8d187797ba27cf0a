"""The store: the one module that reads and writes a namespace's files and its git repository, every write
atomic and fenced (layout: docs/ARCHITECTURE.md, "The writer")."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import stat
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import cache, cached_property
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pygit2

from .errors import ConcurrentChange, LeaseLost, StoreError, UnsafePath
from .lineformat import RawMessage, parse_raw, render_raw
from .namespace import Namespace

log = logging.getLogger(__name__)

MEMORY = "MEMORY.md"
ARCHIVE = "ARCHIVE.md"
PROFILE = "PROFILE.md"
DREAMS = "DREAMS.md"
TRACKED = (MEMORY, ARCHIVE, PROFILE, DREAMS)
#: The store's own folders: never in git, whatever the namespace's `.gitignore` says (one from before `.vault/`
#: was added to it lacks it), nor temp files.
_OWN_DIRS = frozenset((".lucid", ".index", ".vault"))
_GITIGNORE = ".lucid/\n*.tmp\n.index/\n.vault/\n"
_RAW_DAY = re.compile(r"\d{4}-\d{2}-\d{2}\.md")
_RAW_ID = re.compile(r"<!--r:id=([^;>]*)")
_BRANCH, _OID = re.compile(r"ref: refs/heads/(\w[\w.-]*)\n?", re.ASCII), re.compile(r"[0-9a-f]{40}\n?")
#: The store's own paths are strings (`Store._at`): `Path`'s parsing cost more than the opens.
AnyPath = Path | str


def no_symlink(base: Path, path: Path) -> Path:
    """`path`, once no component of it below `base` is a symbolic link (missing components are fine)."""
    current = os.fspath(base)
    for part in _below(base, path):
        current = os.path.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            break
        except NotADirectoryError as exc:
            raise UnsafePath(f"{os.path.dirname(current)} is not a directory") from exc
        if stat.S_ISLNK(mode):
            raise _link_refused(Path(current))
    return path


def _below(base: Path, path: AnyPath) -> tuple[str, ...]:
    """The components of `path` below `base`; UnsafePath if it is not below it. Strings, not `PurePath`
    arithmetic: every file access of a batch passes here (dozens per op)."""
    b, p = os.fspath(base), os.fspath(path)
    parts = tuple(p[len(b) + 1 :].split("/")) if p.startswith(b + "/") else ()
    if p != b and (not parts or "" in parts or "." in parts):  # not plainly below: as `PurePath` reads it
        try:
            parts = Path(p).relative_to(Path(b)).parts
        except ValueError as exc:
            raise UnsafePath(f"{path} is outside the data directory {base}") from exc
    if ".." in parts:
        raise UnsafePath(f"{path} leaves the data directory {base}")
    return parts


def _link_refused(path: AnyPath) -> UnsafePath:
    try:
        target = f" points to {os.readlink(path)!r}"
    except OSError:
        target = ""
    return UnsafePath(
        f"refusing to follow a symbolic link: {path}{target}; "
        "replace it with a real file or directory (Lucid never reads or writes through a link)"
    )


_DIR = os.O_RDONLY | os.O_DIRECTORY


def open_beneath(
    base: Path,
    path: AnyPath,
    flags: int = os.O_RDONLY,
    mode: int = 0o600,
    *,
    makedirs: bool = False,
    dir_mode: int = 0o777,
) -> int:
    """`os.open` of `path` following no link below `base` by construction (each folder opened from the one
    above with O_NOFOLLOW), so a link planted after any check is refused (UnsafePath)."""
    rel = _below(base, path)
    current = os.fspath(base)
    held = getattr(_held, "folders", None)  # `Store.held`: the data directory is open already
    tried = bool(rel and held and (at := held.get(current, -1)) >= 0)
    if tried and (fd := _openat2(at, rel, flags, mode, path, makedirs)) >= 0:
        return fd
    try:
        folder = os.open(current, _DIR)
    except FileNotFoundError:
        if not makedirs:
            raise
        os.makedirs(current, exist_ok=True)  # the data directory itself (above it: the operator's)
        folder = os.open(current, _DIR)
    try:
        if not rel:
            fd, folder = folder, -1
            return fd
        if not tried and (fd := _openat2(folder, rel, flags, mode, path, makedirs)) >= 0:
            return fd
        whole = makedirs and flags & os.O_DIRECTORY  # a folder to open or create: every part is one
        for part in rel if whole else rel[:-1]:
            current = os.path.join(current, part)
            try:
                nxt = _open_at(folder, part, _DIR, 0, current)
            except FileNotFoundError:
                if not makedirs:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_mode, dir_fd=folder)
                nxt = _open_at(folder, part, _DIR, 0, current)
            os.close(folder)
            folder = nxt
        if whole:
            fd, folder = folder, -1
            return fd
        return _open_at(folder, rel[-1], flags, mode, path)
    finally:
        if folder >= 0:
            os.close(folder)


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


def _syscall() -> Any:
    if os.uname().sysname != "Linux":
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
    return fn


_SYSCALL = _syscall()
_held = threading.local()  # `folders`: the data directories this thread holds open (`Store.held`)
_OPENAT2 = 437  # the same number on every Linux architecture since 5.6
_RESOLVE = 0x04 | 0x08  # RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH
_fast_open = _SYSCALL is not None


def _openat2(folder: int, rel: tuple[str, ...], flags: int, mode: int, path: AnyPath, makedirs: bool) -> int:
    """`rel` opened from `folder` in one `openat2` refusing links and escapes (a third of the walk's cost);
    -1 where the walk must decide, so every refusal and its message stay the walk's."""
    global _fast_open
    if not _fast_open:
        return -1
    flags |= os.O_CLOEXEC  # as os.open does
    how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, _RESOLVE)
    fd = _SYSCALL(_OPENAT2, folder, "/".join(rel).encode("utf-8", "surrogateescape"), ctypes.byref(how), 24)
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err == errno.ENOENT and not makedirs:  # links refuse with ELOOP before a missing part is reached
        raise FileNotFoundError(err, os.strerror(err), os.fspath(path))
    if err in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG):  # not this kernel, or a sandbox's
        _fast_open = False
    return -1


def _open_at(folder: int, name: str, flags: int, mode: int, path: AnyPath) -> int:
    """`name` in the open folder `folder`, with O_NOFOLLOW: a link there is refused by the open (UnsafePath;
    lstat only names why: ELOOP, or ENOTDIR for a folder on Linux)."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(path)):
            raise _link_refused(path) from exc
        if exc.errno == errno.ENOTDIR and flags & os.O_DIRECTORY:
            raise UnsafePath(f"{path} is not a directory") from exc
        raise


def read_beneath(base: Path, path: AnyPath) -> bytes:
    """The bytes of `path`, opened by `open_beneath` (no link followed below `base`)."""
    fd = open_beneath(base, path)
    try:
        return _read_all(fd)
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    """The rest of the open file `fd`, in plain reads (a file object costs more than the read of a small
    file: the store reads a dozen a write)."""
    chunks = []
    want = os.fstat(fd).st_size + 1  # a read short of it is the end; a file still growing is read on
    while True:
        chunks.append(os.read(fd, want))
        if len(chunks[-1]) < want:
            return b"".join(chunks)
        want = 1 << 16


@contextlib.contextmanager
def folder_beneath(base: Path, path: AnyPath, makedirs: bool = True, dir_mode: int = 0o777) -> Iterator[int]:
    """The folder `path` opened by `open_beneath` (created if missing), closed after the block."""
    fd = open_beneath(base, path, _DIR, makedirs=makedirs, dir_mode=dir_mode)
    try:
        yield fd
    finally:
        os.close(fd)


def _exists_at(folder: int, name: str, path: AnyPath) -> bool:
    """Whether `name` exists in the open folder `folder`; UnsafePath if it is a symbolic link."""
    try:
        mode = os.lstat(name, dir_fd=folder).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode):
        raise _link_refused(path)
    return True


def _no_link_at(folder: int, name: str, path: AnyPath) -> None:
    """Refuse to replace a link: a rename would not follow it, but would silently swap a planted link for
    a file instead of reporting it."""
    _exists_at(folder, name, path)


def as_bytes(content: str | bytes) -> bytes:
    """A file's content as the bytes written (text as UTF-8, undecodable bytes kept as they were read)."""
    return content if isinstance(content, bytes) else content.encode("utf-8", errors="surrogateescape")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(
    base: Path, path: AnyPath, data: bytes, durable: bool = True, sync: bool = True, dir_mode: int = 0o777
) -> None:
    """Write `data` to `path` so that readers and crashes see the old or the new file, never a mix."""
    parent, name = os.path.split(os.fspath(path))
    with folder_beneath(base, parent, dir_mode=dir_mode) as folder:
        _no_link_at(folder, name, path)
        tmp = _stage_in(folder, name, data, sync)
        try:
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=folder)
            raise
        if durable:
            os.fsync(folder)


def _stage_in(folder: int, name: str, data: bytes, sync: bool = True) -> str:
    """A (synced) temp file holding `data` in the open folder `folder`; returns its name there (the caller
    renames it into place)."""
    while True:
        tmp = f".{name}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
            break
        except FileExistsError:
            continue
    try:
        try:
            _write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)
        raise
    return tmp


def _append(base: Path, path: str, at: int, data: bytes, rel: str) -> None:
    """Append `data` to `path`, which must still be `at` bytes long and the same file once written; a failed
    write (disk full) is taken back. Opened by `open_beneath` (no link followed)."""
    parent, name = os.path.split(path)
    with folder_beneath(base, parent, makedirs=False) as folder:
        fd = _open_at(folder, name, os.O_WRONLY | os.O_APPEND, 0, path)
        try:
            if os.fstat(fd).st_size != at:
                raise ConcurrentChange(rel)
            try:
                half = len(data) // 2
                _write_all(fd, data[:half])  # in two: the fault suite kills between them (a cut append)
                kill_point("append")
                _write_all(fd, data[half:])
                os.fdatasync(fd)
            except OSError:
                os.ftruncate(fd, at)
                raise
            if os.stat(name, dir_fd=folder, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:
                raise ConcurrentChange(rel)
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _truncate(base: Path, path: AnyPath, size: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        fd = open_beneath(base, path, os.O_WRONLY)
        try:
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
                os.fdatasync(fd)
        finally:
            os.close(fd)


def _fsync_dir(base: Path, directory: Path) -> None:
    with folder_beneath(base, directory, makedirs=False) as fd:
        os.fsync(fd)


@contextlib.contextmanager
def flocked(base: Path, path: AnyPath) -> Iterator[None]:
    """A host-wide exclusive lock on `path` (released by the kernel if the process dies); opened by
    `open_beneath` (no link followed below `base`)."""
    fd = open_beneath(base, path, os.O_RDWR | os.O_CREAT, 0o600, makedirs=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@dataclass(frozen=True)
class Snapshot:
    """The tracked files of a namespace as bytes, and the hashes the writer last recorded for them."""

    files: Mapping[str, bytes | None]
    recorded: Mapping[str, str]
    rendered: str | None = None

    def text(self, name: str) -> str | None:
        data = self.files.get(name)
        return None if data is None else data.decode("utf-8", errors="surrogateescape")

    @cached_property
    def hashes(self) -> dict[str, str]:
        return {n: _sha(d) for n, d in self.files.items() if d is not None}

    @property
    def version(self) -> str:
        """A hash over every tracked file: it moves whenever anything a batch depends on changes."""
        return version_of(self.hashes)

    def hand_edited(self) -> list[str]:
        """Files whose content differs from what the writer last wrote (a person edited them)."""
        return [n for n in TRACKED if n in self.hashes and self.recorded.get(n) != self.hashes[n]]

    def rendered_memory(self) -> bool:
        """Whether MEMORY.md is exactly what the writer rendered (so new lines may simply be appended)."""
        return self.rendered is not None and self.hashes.get(MEMORY) == self.rendered


def version_of(hashes: Mapping[str, str]) -> str:
    """The namespace version for these per-file hashes (a missing file counts as absent)."""
    h = hashlib.sha256()
    for name in TRACKED:
        digest = hashes.get(name)
        h.update(name.encode() + b"\0" + (b"-" if digest is None else digest.encode()) + b"\0")
    return h.hexdigest()


class Store:
    """File and git access for the namespaces under one data directory."""

    def __init__(self, data_dir: Path, git: bool = True) -> None:
        self.data_dir = Path(data_dir)
        self.git_enabled = git
        self._commits: dict[str, int] = {}  # commits made by this process, by namespace (packing)
        self._checked: dict[str, str] = {}  # namespace → the boot the writer last checked its git in (`mend`)
        self._read_ok: dict[str, str] = {}  # and the boot a reader found its loose objects whole in
        self._ignores: dict[str, str] = {}  # and the boot this process found its `.gitignore` as it should be
        self._roots: dict[Namespace, tuple[Path, str]] = {}

    def _root(self, ns: Namespace) -> tuple[Path, str]:
        root = self._roots.get(ns)
        if root is None:
            if len(self._roots) > 4096:  # a long-lived process sees every namespace: stay bounded
                self._roots.clear()
            path = ns.path(self.data_dir)
            root = self._roots[ns] = (path, str(path))
        return root

    def path(self, ns: Namespace) -> Path:
        return self._root(ns)[0]

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """While the block runs, this thread's opens below the data directory start from one descriptor of it
        (a batch makes ~30 opens): the same `openat2` refusing links, one `open` and `close` less each."""
        base = os.fspath(self.data_dir)
        folders = _held.__dict__.setdefault("folders", {})
        try:
            fd = -1 if base in folders else os.open(base, _DIR)
        except FileNotFoundError:  # made by the batch's first write
            fd = -1
        if fd >= 0:
            folders[base] = fd
        try:
            yield
        finally:
            if fd >= 0:
                del folders[base]
                os.close(fd)

    def file(self, ns: Namespace, *parts: str) -> Path:
        """A path in the namespace, refused (UnsafePath) if it or a folder on the way is a symbolic link."""
        return no_symlink(self.data_dir, self.path(ns).joinpath(*parts))

    def _at(self, ns: Namespace, *parts: str) -> str:
        """A path in the namespace for an opener that follows no link by construction (`open_beneath`,
        `atomic_write`, `flocked`): the lstat walk of `file()` would only repeat what the open refuses. A
        string: a dozen are made a write, and `Path`'s parsing cost more than the opens."""
        root = self._root(ns)[1]
        return "/".join((root, *parts)) if parts else root

    def _read(self, path: AnyPath) -> bytes:
        """The bytes of `path` (a `file()` path), opened without following any link (`open_beneath`)."""
        return read_beneath(self.data_dir, path)

    def _meta(self, ns: Namespace, name: str) -> str:
        return self._at(ns, ".lucid", name)

    def open_lock(self, ns: Namespace) -> int:
        """The namespace's host-local writer lock file, created if missing, by an open that follows no
        link; the caller flocks and closes the descriptor."""
        return open_beneath(
            self.data_dir, self._meta(ns, "writer.lock"), os.O_RDWR | os.O_CREAT, makedirs=True
        )

    def snapshot(self, ns: Namespace) -> Snapshot:
        files: dict[str, bytes | None] = {}
        for name in TRACKED:
            try:
                files[name] = self._read(self._at(ns, name))
            except FileNotFoundError:
                files[name] = None
        written = self._written(ns)
        rendered = written.get("rendered")
        return Snapshot(files, written.get("hashes") or {}, rendered if isinstance(rendered, str) else None)

    def stamps(self, ns: Namespace, names: Sequence[str]) -> tuple[tuple[int, int], ...]:
        """(mtime ns, size) of each file, (0, -1) if missing: a cache key that moves with any write, read
        from one open folder without following a link."""
        out = []
        try:
            with folder_beneath(self.data_dir, self._at(ns), makedirs=False) as folder:
                for name in names:
                    try:
                        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
                    except FileNotFoundError:
                        out.append((0, -1))
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        raise _link_refused(self._at(ns, name))
                    out.append((st.st_mtime_ns, st.st_size))
        except FileNotFoundError:  # no namespace yet
            return tuple((0, -1) for _ in names)
        return tuple(out)

    def read_text(self, ns: Namespace, name: str) -> str | None:
        try:
            return self._read(self._at(ns, name)).decode("utf-8", errors="surrogateescape")
        except FileNotFoundError:
            return None

    def _read_state(self, ns: Namespace) -> dict[str, Any]:
        return self._read_json(ns, "state.json") or {}

    def _read_json(self, ns: Namespace, name: str) -> dict[str, Any] | None:
        """A JSON object under `.lucid/`: None if the file is missing, {} if it is not one (torn)."""
        try:
            data = json.loads(self._read(self._meta(ns, name)).decode("utf-8"))
        except FileNotFoundError:
            return None
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def _written(self, ns: Namespace) -> dict[str, Any]:
        """The writer's record of its last write (hashes, the commit it may fold into, the MEMORY.md it
        rendered). Older data directories kept the hashes and the fold in state.json."""
        written = self._read_json(ns, "written.json")
        if written is None:
            state = self._read_state(ns)
            return {k: state[k] for k in ("hashes", "fold") if k in state}
        return written

    def written_value(self, ns: Namespace, key: str) -> Any:
        return self._written(ns).get(key)

    def _update_state(self, ns: Namespace, **values: Any) -> None:
        # Read-modify-write under a lock: the writer (hashes) and jobs (watermarks) both update it.
        with flocked(self.data_dir, self._meta(ns, "state.lock")):
            state = self._read_state(ns)
            state.update(values)
            data = json.dumps(state, sort_keys=True).encode()
            atomic_write(self.data_dir, self._meta(ns, "state.json"), data, durable=False)

    def state_value(self, ns: Namespace, key: str) -> Any:
        """A small persisted value of the namespace (phase watermarks, last-run times); not in git."""
        return self._read_state(ns).get(key)

    def set_state_value(self, ns: Namespace, key: str, value: Any) -> None:
        if key == "hashes":
            raise ValueError("hashes belong to the writer")
        self._update_state(ns, **{key: value})

    def read_fence(self, ns: Namespace) -> int:
        try:
            return int(self._read(self._meta(ns, "fence")).decode().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def claim_fence(self, ns: Namespace, token: int) -> None:
        """Record `token` as the newest; this fences every older holder out at once. Idempotent for the
        holder of `token` (a leader claims once per batch it runs)."""
        with flocked(self.data_dir, self._meta(ns, "fence.lock")):
            current = self.read_fence(ns)
            if token < current:
                raise LeaseLost(f"fencing token {token} is older than {current}")
            if token > current:  # equal: this holder already claimed it (tokens are unique per lease)
                atomic_write(self.data_dir, self._meta(ns, "fence"), str(token).encode())

    @contextlib.contextmanager
    def fenced(self, ns: Namespace, token: int, still_held: Callable[[], bool]) -> Iterator[None]:
        """Hold the fence lock while the body replaces files; refuse if the token is stale."""
        with flocked(self.data_dir, self._meta(ns, "fence.lock")):
            current = self.read_fence(ns)
            if current != token or not still_held():
                raise LeaseLost(f"write refused: fencing token {token} is stale (current {current})")
            yield

    def replace_files(
        self,
        ns: Namespace,
        before: Snapshot,
        files: Mapping[str, str | bytes],
        raw: Mapping[str, str] | None = None,
        journal: Mapping[str, Any] | None = None,
    ) -> dict[str, str]:
        """Write the changed tracked files and raw day files (caller holds `fenced`); returns the new
        hashes of every tracked file."""
        root = self._at(ns)
        os.close(open_beneath(self.data_dir, root, _DIR, makedirs=True))
        for name in TRACKED:
            if self._maybe(self._at(ns, name)) != before.files.get(name):
                raise ConcurrentChange(name)
        hashes = dict(before.hashes)
        writes: list[tuple[str, bytes, bytes | None]] = []  # (path in the namespace, new, current)
        for name, day in (raw or {}).items():
            current = self._maybe(self._at(ns, "raw", name))
            writes.append((f"raw/{name}", as_bytes(day), current))
        for name in (ARCHIVE, PROFILE, DREAMS, MEMORY):
            if name in files:
                data = as_bytes(files[name])
                hashes[name] = _sha(data)
                if data != before.files.get(name):
                    writes.append((name, data, before.files.get(name)))
        prior = {
            rel: cur for rel, data, cur in writes if cur and len(data) > len(cur) and data.startswith(cur)
        }
        appends = {rel: (len(cur), data[len(cur) :]) for rel, data, _ in writes if (cur := prior.get(rel))}
        # Stage every temp file first, so ENOSPC or EACCES hits before any file is replaced; folders opened
        # by `open_beneath` and renames relative to them, so a link planted since is never written through.
        folders: dict[str, int] = {}
        staged: list[tuple[int, str, str]] = []
        appended: list[tuple[str, int]] = []
        try:
            for rel, data, _ in writes:
                if rel not in appends:
                    path = self._at(ns, rel)
                    parent, name = os.path.split(path)
                    if parent not in folders:
                        folders[parent] = open_beneath(self.data_dir, parent, _DIR, makedirs=True)
                    folder = folders[parent]
                    _no_link_at(folder, name, path)
                    staged.append((folder, _stage_in(folder, name, data), name))
            if journal is not None:
                self.write_journal(
                    ns,
                    {
                        **journal,
                        "target": {name: hashes[name] for name in files},
                        "appends": {
                            rel: {
                                "at": at,
                                "data": base64.b64encode(more).decode(),
                                "before": base64.b64encode(prior[rel][-64:]).decode(),
                            }
                            for rel, (at, more) in appends.items()
                        },
                    },
                    sync=bool(appends),
                )
            for rel, (at, more) in appends.items():
                path = self._at(ns, rel)
                _append(self.data_dir, path, at, more, rel)
                appended.append((path, at))
            for folder, tmp, name in staged:
                os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
            for folder in {folder for folder, _, _ in staged}:
                os.fsync(folder)
        except BaseException as exc:
            for path, at in appended:  # nothing of a failed batch stays: what it appended is taken back
                _truncate(self.data_dir, path, at)
            for folder, tmp, _ in staged:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=folder)
            if journal is not None:
                self.clear_journal(ns)
            if isinstance(exc, OSError) and not isinstance(exc, ConcurrentChange):
                raise StoreError(_os_message(exc, root)) from exc
            raise
        finally:
            for folder in folders.values():
                os.close(folder)
        return hashes

    def _maybe(self, path: AnyPath) -> bytes | None:
        """The bytes of `path` (opened as `_read` does), None if it does not exist."""
        try:
            return self._read(path)
        except FileNotFoundError:
            return None

    def undo_cut_appends(self, ns: Namespace, journal: Mapping[str, Any]) -> None:
        """Take back an append the journal's batch did not finish, so no file ends with a torn line; a file
        a person edited since is left alone."""
        for rel, spec in (journal.get("appends") or {}).items():
            try:
                path = self.file(ns, *str(rel).split("/"))
                at, more = int(spec["at"]), base64.b64decode(spec["data"])
                before = base64.b64decode(spec["before"])
                data = self._read(path)
            except (FileNotFoundError, KeyError, TypeError, ValueError):
                continue
            tail = data[at:]
            ours = len(data) >= at >= len(before) and data[at - len(before) : at] == before
            if ours and len(tail) < len(more) and more.startswith(tail):
                _truncate(self.data_dir, path, at)
                log.warning("took back a cut append of %s/%s (%d of %d bytes)", ns, rel, len(tail), len(more))

    def record_written(self, ns: Namespace, **values: Any) -> None:
        """Record what the writer wrote: `hashes` of the tracked files, the MEMORY.md it `rendered`, the
        commit the next one may `fold` into (messages and hit counts only, or None)."""
        with flocked(self.data_dir, self._meta(ns, "state.lock")):
            written = self._written(ns)
            written.update(values)
            atomic_write(
                self.data_dir,
                self._meta(ns, "written.json"),
                json.dumps(written, sort_keys=True).encode(),
                durable=False,
                sync=False,
            )

    def write_journal(self, ns: Namespace, journal: Mapping[str, Any], sync: bool = False) -> None:
        """Written in place: a journal cut short is not JSON and counts as none (nothing of its batch was
        written yet). Synced only with `sync`: only an append needs its journal to survive."""
        path = self._meta(ns, "journal.json")
        with folder_beneath(self.data_dir, self._at(ns, ".lucid")) as folder:
            try:
                os.lstat("journal.json", dir_fd=folder)
                created = False
            except FileNotFoundError:
                created = True
            fd = _open_at(folder, "journal.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, path)
            try:
                _write_all(fd, json.dumps(journal).encode())
                if sync:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
            if sync and created:
                os.fsync(folder)

    def read_journal(self, ns: Namespace) -> dict[str, Any] | None:
        data = self._read_json(ns, "journal.json")
        return data or None

    def clear_journal(self, ns: Namespace) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.close(open_beneath(self.data_dir, self._meta(ns, "journal.json"), os.O_WRONLY | os.O_TRUNC))

    def set_aside(self, ns: Namespace, name: str, line: str) -> str:
        """Keep a hand-edited line too long to be memory, as given (the writer has redacted its secrets), out
        of the files and out of git (private state, mode 0600). Returns where, relative to the namespace."""
        data = as_bytes(line)
        where = f".lucid/set-aside/{Path(name).stem}-{_sha(data)[:12]}.txt"
        path = self.file(ns, *where.split("/"))
        atomic_write(self.data_dir, path, data, dir_mode=0o700)
        return where

    def append_vault(self, ns: Namespace, lines: list[str]) -> None:
        """Append sealed (encrypted) records to the namespace's vault; never in git (.gitignore)."""
        path = self.file(ns, ".vault", "secrets.enc")
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        fd = open_beneath(self.data_dir, path, flags, 0o600, makedirs=True, dir_mode=0o700)
        try:
            os.write(fd, "".join(line + "\n" for line in lines).encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_vault(self, ns: Namespace) -> list[str]:
        data = self._maybe(self.file(ns, ".vault", "secrets.enc"))
        return [] if data is None else data.decode().split()

    def save_cache(
        self, ns: Namespace, name: str, files: Mapping[str, bytes], manifest: Mapping[str, Any]
    ) -> str:
        """Replace the derived cache `.index/<name>/`: the files into a fresh `gen-*` folder, then an atomic
        `manifest.json` naming it, then older folders deleted. A crash leaves the old cache or the new.
        Returns the new generation's name (the manifest's "generation")."""
        root = self.file(ns, ".index", name)
        gen = f"gen-{uuid.uuid4().hex[:12]}"
        for part in files:
            self.file(ns, ".index", name, gen, part)  # the clear refusal of a bad part name, early
        with folder_beneath(self.data_dir, root) as top:  # every open below is relative: no link followed
            os.mkdir(gen, dir_fd=top)
            fd = _open_at(top, gen, _DIR, 0, root / gen)
            try:
                for part, data in files.items():
                    tmp = _stage_in(fd, part, data)
                    os.replace(tmp, part, src_dir_fd=fd, dst_dir_fd=fd)
                os.fsync(fd)
            finally:
                os.close(fd)
            kill_point("cache")
            manifest_data = json.dumps({**manifest, "generation": gen}).encode()
            tmp = _stage_in(top, "manifest.json", manifest_data)
            os.replace(tmp, "manifest.json", src_dir_fd=top, dst_dir_fd=top)
            os.fsync(top)
            for old in os.listdir(top):
                if old.startswith("gen-") and old != gen:
                    shutil.rmtree(old, ignore_errors=True, dir_fd=top)  # refuses a link (ignored)
        return gen

    def drop_cache(self, ns: Namespace, name: str) -> None:
        """Delete the cache `.index/<name>/` (no link followed): for when it may hold what must not stay and
        cannot be saved anew. Deleting needs no free space."""
        with (
            contextlib.suppress(FileNotFoundError),
            folder_beneath(self.data_dir, self.file(ns, ".index"), makedirs=False) as top,
        ):
            shutil.rmtree(name, dir_fd=top)

    def load_cache(self, ns: Namespace, name: str) -> tuple[dict[str, Any], Callable[[str], bytes]] | None:
        """The cache `save_cache` wrote last: its manifest and a reader of its files; None if there is no
        readable one. Raises UnsafePath when a link is planted on the way."""
        try:  # `_read` refuses a link on the way (UnsafePath), as `file()` would, without its lstat walk
            manifest = json.loads(self._read(self._at(ns, ".index", name, "manifest.json")))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError):
            return None
        gen = manifest.get("generation") if isinstance(manifest, dict) else None
        if not isinstance(gen, str) or not re.fullmatch(r"gen-[0-9a-f]{12}", gen):
            return None

        def read(part: str) -> bytes:
            return self._read(self._at(ns, ".index", name, gen, part))

        return manifest, read

    def raw_day_name(self, when: datetime) -> str:
        return f"{when:%Y-%m-%d}.md"

    def raw_ids(self, ns: Namespace, day_name: str) -> set[str]:
        text = self.read_text_raw(ns, day_name)
        return {unquote(i) for i in _RAW_ID.findall(text)} if text else set()

    def read_text_raw(self, ns: Namespace, day_name: str) -> str | None:
        try:
            return self._read(self._at(ns, "raw", day_name)).decode("utf-8", errors="surrogateescape")
        except FileNotFoundError:
            return None

    def read_raw_from(self, ns: Namespace, day_name: str, start: int) -> tuple[int, bytes]:
        """A day file's size and its bytes from `start` on (b"" when it is shorter: rewritten by hand),
        from one open that follows no link: the raw index reads only what was appended since."""
        with os.fdopen(open_beneath(self.data_dir, self._at(ns, "raw", day_name)), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size <= start:
                return size, b""
            fh.seek(start)
            return size, fh.read(size - start)

    def raw_days(self, ns: Namespace) -> list[str]:
        return list(self.raw_sizes(ns))

    def raw_sizes(self, ns: Namespace) -> dict[str, int]:
        """Each day file's size, by name in date order, from one listing (no file opened, no link followed:
        a search reads only the days that grew)."""
        try:
            with folder_beneath(self.data_dir, self.file(ns, "raw"), makedirs=False) as raw:
                names = sorted(n for n in os.listdir(raw) if _RAW_DAY.fullmatch(n))
                sizes = {}
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        sizes[name] = os.stat(name, dir_fd=raw, follow_symlinks=False).st_size
                return sizes
        except (FileNotFoundError, UnsafePath) as exc:
            if isinstance(exc, UnsafePath) and "not a directory" not in str(exc):
                raise
            return {}

    def iter_raw(self, ns: Namespace, days: list[str] | None = None) -> Iterator[RawMessage]:
        """Every readable message of the raw archive, in file order (unreadable lines are skipped)."""
        from .errors import LineError

        for day in days if days is not None else self.raw_days(ns):
            text = self.read_text_raw(ns, day) or ""
            for line in text.split("\n"):
                if line.startswith("- "):
                    try:
                        yield parse_raw(line)
                    except LineError:
                        log.warning("unreadable raw line in %s/raw/%s", ns, day)

    @staticmethod
    def append_raw_lines(existing: str | None, messages: list[RawMessage]) -> str:
        head = existing if existing else f"# Messages {messages[0].ts:%Y-%m-%d}\n\n"
        if not head.endswith("\n"):
            head += "\n"
        return head + "".join(render_raw(m) + "\n" for m in messages)

    # In-process with pygit2: libgit2 writes objects by temp file + rename; we replace the ref and the index
    # with `atomic_write`, so a writer killed mid-commit leaves no `.lock` to refuse the next commit.

    def _repo(self, ns: Namespace) -> pygit2.Repository:
        """For reading: the first open since a boot refuses a repository with cut objects (`mend`) instead of
        hanging in libgit2 on one."""
        if boot_id() not in (self._checked.get(str(ns)), self._read_ok.get(str(ns))):
            try:
                cut = cut_objects(self.data_dir, self.file(ns, ".git"))
            except OSError as exc:
                raise StoreError(f"cannot read the git history of {ns}: {exc.strerror or exc}") from exc
            if cut:
                raise StoreError(
                    f"the git history of {ns} has {len(cut)} object(s) a crash cut short; the next write "
                    "mends it (the memory files are whole)"
                )
            _note(self._read_ok, ns)
        return self._open(ns)

    def _open(self, ns: Namespace, checked: bool = False) -> pygit2.Repository:
        """`checked`: the caller has just opened the namespace's folder and `.git` by opens that refuse a link
        (`commit`), so the lstat walk of `file()` would only repeat them."""
        _isolate_git_config()
        try:
            return pygit2.Repository(str(self._at(ns) if checked else self.file(ns)))
        except pygit2.GitError as exc:
            raise StoreError(f"cannot open the git repository of {ns}: {exc}") from exc

    def ensure_repo(self, ns: Namespace) -> None:
        """Make the namespace's folder and repository if missing."""
        root = self._at(ns)
        with folder_beneath(self.data_dir, root) as folder:  # made if missing
            if not self.git_enabled:
                return
            if _exists_at(folder, ".git", f"{root}/.git"):
                if self._ignores.get(str(ns)) != boot_id():  # once a process: missing (a writer killed at
                    ignore = f"{root}/.gitignore"  # creation) or from an older version
                    if self._maybe(ignore) != _GITIGNORE.encode():
                        atomic_write(self.data_dir, ignore, _GITIGNORE.encode(), durable=False, sync=False)
                    _note(self._ignores, ns)
                return
        # .gitignore first: a writer killed before it was written left a repository whose next commit
        # tracked the writer's own `.lucid/` files. Not synced: one a power cut left cut is written again
        # above, and `_own` keeps the store's folders out of every commit meanwhile.
        atomic_write(self.data_dir, f"{root}/.gitignore", _GITIGNORE.encode(), durable=False, sync=False)
        with folder_beneath(self.data_dir, root, makedirs=False) as folder:
            # Made beside and renamed into place: a half-made `.git` never looks like a repository.
            tmp = _git_skeleton(folder)
            _no_link_at(folder, ".git", f"{root}/.git")
            os.replace(tmp, ".git", src_dir_fd=folder, dst_dir_fd=folder)
        _note(self._checked, ns)  # made in this boot: nothing in it to mend (a tenure's later batches too)

    def mend_after_boot(
        self, ns: Namespace, token: int, still_held: Callable[[], bool], record: bool = False
    ) -> None:
        """`mend` once a boot, before the writer's first batch of `ns` in this process reads anything of git:
        the boot of the writer's last batch (`BOOT` in `written.json`) tells a process started since it (no crash
        since) that there is nothing to check. Under the fence of lease `token`; `record`: say so in
        `written.json` now (a reader's mend: no batch follows to record it)."""
        if not self.mended(ns):
            kill_point("mend")
            with self.fenced(ns, token, still_held):
                self.mend(ns)
                if record:
                    self.record_written(ns, **{BOOT: boot_id()})
            _note(self._checked, ns)

    def mended(self, ns: Namespace) -> bool:
        """Whether git of `ns` is known whole in this boot: checked by this process, or written by a batch made
        since the boot (which checked it first)."""
        if self._checked.get(str(ns)) == boot_id():
            return True
        if self.written_value(ns, BOOT) != boot_id():
            return False
        _note(self._checked, ns)
        return True

    def mend(self, ns: Namespace) -> bool:
        """Make the namespace's git whole after a power cut (under the writer's fence; docs/RELIABILITY.md):
        cut loose objects dropped, those the files still hold written again, the branch on the newest whole
        commit and the files committed on it. The files are never touched. Returns whether anything was
        mended."""
        if not self.git_enabled:
            return False
        git = self.file(ns, ".git")
        if not git.is_dir():
            return False
        mended = _mend_skeleton(self.data_dir, git)
        objects = git / "objects"
        cut = set(cut_objects(self.data_dir, git))
        for oid in cut:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(objects / oid[:2] / oid[2:])
        if cut:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(git / "index")  # derived from HEAD's tree; the next commit writes it again
        journal = self.read_journal(ns)
        if journal:  # an append the cut tore is taken back first (as `_recover` will: it is idempotent)
            self.undo_cut_appends(ns, journal)
        names = [*TRACKED, ".gitignore", *(f"raw/{day}" for day in self.raw_days(ns))]
        on_disk = {name: self._maybe(self._at(ns, *name.split("/"))) for name in names}
        repo = self._open(ns)
        restored = 0
        for data in on_disk.values():
            if data is not None and str(pygit2.hash(data)) in cut:
                repo.create_blob(data)
                restored += 1
        repo = self._open(ns)  # nothing cached from before the objects were dropped
        was = _head_target(repo)
        tip, broken = _whole_tip(self.data_dir, repo, objects)  # checked even when nothing is cut
        for oid in broken:  # not whole: left loose, the packer would pack them as if they were
            with contextlib.suppress(FileNotFoundError):
                os.unlink(objects / oid[:2] / oid[2:])
        if tip != was:
            ref = git.joinpath(*_branch(repo).split("/"))
            if tip is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(ref)  # no commit is whole: the next one starts the history again
            else:
                atomic_write(self.data_dir, ref, f"{tip}\n".encode(), durable=False)
        # Every file the writer wrote as it is now, raw days included (a batch's commit names only its own):
        # the branch may stand behind them (moved here, by an earlier mend that died, or a lost ref). A file
        # edited by hand keeps the branch's version, for the writer's hand-edit path to redact and commit.
        recorded = self._written(ns).get("hashes") or {}
        exact = {name: data for name, data in on_disk.items() if name.startswith("raw/")}
        for name in TRACKED:
            now = on_disk[name]
            if now is not None and recorded.get(name) == _sha(now):
                exact[name] = now
        if on_disk[".gitignore"] is not None:
            exact[".gitignore"] = _GITIGNORE.encode()
        committed = self._commit(ns, "recover after a crash", exact, None)
        if not (cut or mended or broken or tip != was or committed):
            return False
        log.warning(
            "git of %s mended after a crash: %d cut objects dropped (%d written again from the files), "
            "branch %s → %s%s",
            ns.key,
            len(cut) + len(broken),
            restored,
            str(was)[:10] if was else "-",
            str(tip)[:10] if tip else "(none: history starts again)",
            ", the files committed on it" if committed else "",
        )
        return True

    def head(self, ns: Namespace) -> str | None:
        """The full id of the newest commit, or None before the first one (or without git)."""
        if not self.git_enabled:
            return None
        # HEAD naming a loose branch (the writer's layout): two small reads, not a repository opened for it.
        # Anything else (no `.git`, unborn, packed, detached) is read as before.
        with contextlib.suppress(OSError, UnicodeDecodeError):
            ref = _BRANCH.fullmatch(self._read(self._at(ns, ".git", "HEAD")).decode())
            oid = self._read(self._at(ns, ".git", "refs", "heads", ref[1])).decode() if ref else ""
            if _OID.fullmatch(oid):
                return oid.strip()
        if not self.file(ns, ".git").exists():
            return None
        repo = self._repo(ns)
        return None if repo.head_is_unborn else str(repo.head.target)

    def commit(
        self,
        ns: Namespace,
        message: str,
        exact: Mapping[str, bytes | None] | None = None,
        amend: str | None = None,
    ) -> str | None:
        """Commit the namespace; returns the new short revision, or None if nothing changed."""
        if not self.git_enabled:
            return None
        self.ensure_repo(ns)
        root = self._at(ns)
        git = f"{root}/.git"
        with folder_beneath(self.data_dir, root, makedirs=False) as folder:  # libgit2 follows links: none
            ignored = _exists_at(folder, ".gitignore", f"{root}/.gitignore")
            inner = _open_at(folder, ".git", _DIR, 0, git)
            try:
                for inside in ("objects", "refs", "index", "HEAD"):  # where git itself writes
                    _exists_at(inner, inside, f"{git}/{inside}")
            finally:
                os.close(inner)
        if exact is not None and ignored:
            exact = {**exact, ".gitignore": _GITIGNORE.encode()}
        try:
            return self._commit(ns, message, exact, amend)
        except (pygit2.GitError, OSError, KeyError) as exc:
            if getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc):
                raise StoreError(
                    f"disk full while committing {ns} to git: the files are written and are committed "
                    "by the next write once space is freed"
                ) from exc
            raise StoreError(f"git commit of {ns} failed: {exc}") from exc

    def _commit(
        self, ns: Namespace, message: str, exact: Mapping[str, bytes | None] | None, amend: str | None
    ) -> str | None:
        repo = self._open(ns, checked=True)
        head = None if repo.head_is_unborn else repo[repo.head.target].peel(pygit2.Commit)
        # The index file is replaced by `_write_index` (a temp file renamed into place), never locked.
        tmp = os.path.join(self._at(ns, ".git"), f"index.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        staged: pygit2.Index | None = None
        if exact is None:
            index = repo.index  # used in memory only
            if head is not None:
                index.read_tree(head.tree)
            else:
                index.clear()
            root = self.file(ns)
            # Not `add_all`: it writes a blob of every file `.gitignore` lets by, the vault's too if emptied.
            for path in _hand_files(repo, root):
                index.add(path)
            for gone in [e.path for e in index if _own(e.path) or not (root / e.path).exists()]:
                index.remove(gone)  # `add -A` also records deletions
        else:
            # Built once, as the temp file it is written to: its bytes are those of the tree read afresh.
            index = staged = pygit2.Index(tmp)
            if head is not None:
                index.read_tree(head.tree)
            for name, data in exact.items():
                if data is not None:
                    index.add(pygit2.IndexEntry(name, _blob(repo, index, name, data), _FILE))
        tree = index.write_tree(repo)
        parents = [] if head is None else [head.id]
        if amend is not None and head is not None and str(head.id) == amend:
            parents = list(head.parent_ids)
            if parents and repo[parents[0]].peel(pygit2.Commit).tree_id == tree:
                return None  # nothing left to fold: keep HEAD as it is
        elif head is not None and head.tree_id == tree:
            return None
        sig = pygit2.Signature(*_SIGNATURE)
        oid = repo.create_commit(None, sig, sig, message.rstrip("\n") + "\n", tree, parents)
        kill_point("objects")
        # The index first, then the ref: a crash between the two leaves HEAD behind the index, which the
        # next commit (built from HEAD's tree) mends; never a ref to a commit the index does not match.
        self._write_index(ns, repo, tree, tmp, staged)
        kill_point("index")
        ref = self._at(ns, ".git", *_branch(repo).split("/"))
        # Not synced, like the objects it names: after a power cut `mend` finds its commit whatever it holds.
        atomic_write(self.data_dir, ref, f"{oid}\n".encode(), durable=False, sync=False)
        kill_point("ref")
        self._maybe_pack(ns, repo)
        return str(oid)[:7]

    def _write_index(
        self, ns: Namespace, repo: pygit2.Repository, tree: pygit2.Oid, tmp: str, staged: pygit2.Index | None
    ) -> None:
        """The index of `tree` written to `tmp` (libgit2 makes it; `staged`: already built for it), then
        renamed over `.git/index`."""
        git = self._at(ns, ".git")
        try:
            if staged is None:
                staged = pygit2.Index(tmp)
                staged.read_tree(repo[tree].peel(pygit2.Tree))
            staged.write()
            with folder_beneath(self.data_dir, git, makedirs=False) as folder:
                _no_link_at(folder, "index", f"{git}/index")
                os.replace(os.path.basename(tmp), "index", src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _maybe_pack(self, ns: Namespace, repo: pygit2.Repository) -> None:
        """Pack the loose objects once there are LOOSE_MAX of them or LOOSE_BYTES (under the writer lease)."""
        key = str(ns)
        self._commits[key] = self._commits.get(key, 0) + 1
        if self._commits[key] % PACK_CHECK_EVERY:
            return
        objects = self.file(ns, ".git", "objects")
        loose = _loose_objects(objects)
        if len(loose) < LOOSE_MAX and _size(objects, loose) < LOOSE_BYTES:
            return
        packs = sorted((objects / "pack").glob("pack-*.pack"), key=lambda p: p.stat().st_size)
        counts = {p: len(_pack_ids(self.data_dir, p)) for p in packs}
        packed = sum(p.stat().st_size for p in packs)
        if sum(counts.values()) + len(loose) <= REPACK_ALL_OBJECTS and packed <= REPACK_ALL_BYTES:
            self._pack(self.data_dir, repo, objects, None, loose, packs)
        elif len(packs) + 1 >= PACKS_MAX:  # geometric: the largest pack stays, the others merge
            merged = packs[:-1]
            self._pack(
                self.data_dir,
                repo,
                objects,
                [*loose, *(i for p in merged for i in _pack_ids(self.data_dir, p))],
                loose,
                merged,
            )
        else:
            self._pack(self.data_dir, repo, objects, loose, loose, [])

    @staticmethod
    def _pack(
        base: Path,
        repo: pygit2.Repository,
        objects: Path,
        oids: list[str] | None,
        loose: list[str],
        old: list[Path],
    ) -> None:
        """Write `oids` (None: all reachable from HEAD) as one durable pack, then drop `loose` and `old`; a
        process holding an old pack keeps reading it (POSIX), and libgit2 rescans when it misses an object."""
        builder = pygit2.PackBuilder(repo)
        builder.set_threads(1)
        if oids is None:
            for commit in repo.walk(repo.head.target):
                builder.add_recur(commit.id)
        else:
            for oid in oids:
                builder.add(pygit2.Oid(hex=oid))
        pack_dir = objects / "pack"
        pack_dir.mkdir(exist_ok=True)
        before = set(pack_dir.glob("pack-*"))
        builder.write(str(pack_dir))
        made = [p for p in pack_dir.glob("pack-*") if p not in before]
        for path in made:
            fd = open_beneath(base, path)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(base, pack_dir)
        kill_point("pack")
        for oid in loose:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(objects / oid[:2] / oid[2:])
        kept = {p.with_suffix("") for p in made}
        for pack in old:
            if pack.with_suffix("") not in kept:
                for suffix in (".idx", ".rev", ".pack"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(pack.with_suffix(suffix))

    def _commit_of(self, repo: pygit2.Repository, rev: str) -> pygit2.Commit | None:
        try:
            return repo.revparse_single(rev).peel(pygit2.Commit)
        except (KeyError, ValueError, pygit2.GitError, pygit2.InvalidSpecError):
            return None

    def _log(self, ns: Namespace) -> Iterator[pygit2.Commit]:
        if not self.file(ns, ".git").exists():
            return iter(())
        repo = self._repo(ns)
        if repo.head_is_unborn:
            return iter(())
        return iter(
            repo.walk(repo.head.target, pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.TIME)
        )

    def committed_text(self, ns: Namespace, name: str) -> str | None:
        """`name` as of the namespace's last commit (None: no git, no commit, or not in it)."""
        if not self.git_enabled or not self.file(ns, ".git").exists():
            return None
        commit = self._commit_of(self._repo(ns), "HEAD")
        if commit is None:
            return None
        try:
            blob = commit.tree[name].peel(pygit2.Blob)
        except KeyError:
            return None
        return str(blob.data.decode("utf-8", errors="surrogateescape"))

    def history(self, ns: Namespace, limit: int = 50) -> list[dict[str, str]]:
        rows: list[dict[str, str]] = []
        for commit in self._log(ns):
            if len(rows) >= limit:
                break
            rows.append({"rev": str(commit.id), "time": _iso(commit.author), "message": _subject(commit)})
        return rows

    def show(self, ns: Namespace, rev: str, limit: int = 20_000) -> str:
        """The diff one commit made to the tracked files (for the viewer's dream journal)."""
        if not re.fullmatch(r"[0-9a-fA-F]{4,40}", rev):
            raise StoreError(f"not a revision: {rev!r}")
        if not self.file(ns, ".git").exists():
            return ""
        repo = self._repo(ns)
        commit = self._commit_of(repo, rev)
        if commit is None:
            return ""
        parent = commit.parents[0].tree if commit.parents else None
        if parent is None:
            diff = commit.tree.diff_to_tree(context_lines=0, swap=True)
        else:
            diff = parent.diff_to_tree(commit.tree, context_lines=0)
        out = "".join(
            p.text or ""
            for p in diff
            if p is not None and (p.delta.new_file.path in TRACKED or p.delta.old_file.path in TRACKED)
        )
        return out if len(out) <= limit else out[:limit] + "\n… (diff cut)"

    def resolve(self, ns: Namespace, rev: str) -> str:
        """The full id of commit `rev` (a hex prefix, or HEAD / HEAD~N). Raises StoreError if none."""
        if not re.fullmatch(r"[0-9a-fA-F]{4,40}|HEAD(~\d+)?", rev):
            raise StoreError(f"not a revision: {rev!r}")
        if not self.file(ns, ".git").exists():
            raise StoreError(f"no history for {ns} yet")
        commit = self._commit_of(self._repo(ns), rev)
        if commit is None:
            raise StoreError(f"no commit {rev!r} in the history of {ns} (see `lucid history`)")
        return str(commit.id)

    def subject(self, ns: Namespace, rev: str) -> str:
        commit = self._commit_of(self._repo(ns), rev)
        if commit is None:
            raise StoreError(f"no commit {rev!r} in the history of {ns}")
        return _subject(commit)

    def files_at(self, ns: Namespace, rev: str) -> dict[str, str | None]:
        """The tracked files as commit `rev` had them (None: absent, or no such commit — `root^`)."""
        out: dict[str, str | None] = dict.fromkeys(TRACKED)
        commit = self._commit_of(self._repo(ns), rev) if self.file(ns, ".git").exists() else None
        if commit is None:
            return out
        for name in TRACKED:
            if name in commit.tree:
                blob = commit.tree[name].peel(pygit2.Blob)
                out[name] = blob.data.decode("utf-8", errors="surrogateescape")
        return out

    def past_texts(self, ns: Namespace, names: tuple[str, ...]) -> Iterator[str]:
        """Every distinct version of `names` any commit holds, newest first: where `forget --purge` finds
        an entry that is already gone from the files (forgotten earlier, or deleted by hand)."""
        if not self.git_enabled:
            return
        seen: set[str] = set()
        for commit in self._log(ns):
            for name in names:
                if name in commit.tree and (oid := str(commit.tree[name].id)) not in seen:
                    seen.add(oid)
                    blob = commit.tree[name].peel(pygit2.Blob)
                    yield blob.data.decode("utf-8", errors="surrogateescape")

    def revisions_touching(
        self, ns: Namespace, names: tuple[str, ...], limit: int = 200
    ) -> list[tuple[str, str]]:
        """(full id, subject) of the newest commits (at most `limit`) that changed any of `names`."""
        rows: list[tuple[str, str]] = []
        for commit in self._log(ns):
            if len(rows) >= limit:
                break
            parent = commit.parents[0].tree if commit.parents else None
            if any(_entry_id(commit.tree, n) != _entry_id(parent, n) for n in names):
                rows.append((str(commit.id), _subject(commit)))
        return rows


_SIGNATURE = ("Lucid", "lucid@localhost")
_FILE = pygit2.enums.FileMode.BLOB
_SAME_MAX = 1 << 16  # bytes up to which a file is hashed first to find it unchanged since HEAD
PACK_CHECK_EVERY = 4  # commits (per process and namespace) between two counts of the loose objects
LOOSE_MAX = 32  # loose objects that are packed together (one pack of deltas)
PACKS_MAX = 8  # packs that are merged into one
LOOSE_BYTES = 1 << 20  # or once they take this much
REPACK_ALL_OBJECTS = 256  # objects up to which a namespace is repacked whole at each packing
REPACK_ALL_BYTES = 1 << 20  # and packed bytes: past them a whole repack (deltas redone) costs seconds
_isolated = False


def kill_point(name: str) -> None:
    """The fault suite's SIGKILL inside a write (LUCID_KILL_POINT=append|tenure|objects|index|ref|pack|recover|
    hand|mend) or a cache save; or its SIGSTOP there (LUCID_PAUSE_POINT: a process paused past its lease, then
    woken; `then`: before a purge's history rewrite)."""
    if os.environ.get("LUCID_KILL_POINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("LUCID_PAUSE_POINT") == name:
        os.kill(os.getpid(), signal.SIGSTOP)


def _isolate_git_config() -> None:
    """Read no user or system git configuration (as the CLI calls did with GIT_CONFIG_GLOBAL=/dev/null):
    a person's `core.autocrlf` or hooks must not change what the writer commits. An empty search path, not
    /dev/null: libgit2 stats the files it would read (`/dev/null/.gitconfig`) at every config lookup."""
    global _isolated
    if not _isolated:
        for level in (
            pygit2.enums.ConfigLevel.GLOBAL,
            pygit2.enums.ConfigLevel.XDG,
            pygit2.enums.ConfigLevel.SYSTEM,
        ):
            pygit2.settings.search_path[level] = ""  # none: libgit2 does not stat a path at each lookup
        _isolated = True


#: What git and libgit2 need to open a repository; written here, not by `pygit2.init_repository`, whose
#: probing and config rewrites cost 1.5 ms of a new person's first write.
_SKELETON_DIRS = ("objects", "refs")
_SKELETON_FILES = (
    ("HEAD", b"ref: refs/heads/main\n"),
    ("config", b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"),
)


def _git_skeleton(folder: int) -> str:
    """An empty repository made in a new temp folder of the open folder `folder`; returns its name there."""
    while True:
        tmp = f".git.{os.urandom(6).hex()}.tmp"
        try:
            os.mkdir(tmp, 0o777, dir_fd=folder)
            break
        except FileExistsError:
            continue
    fd = _open_at(folder, tmp, _DIR, 0, tmp)
    try:
        for name in _SKELETON_DIRS:
            os.mkdir(name, 0o777, dir_fd=fd)
        for name, data in _SKELETON_FILES:
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
            try:
                _write_all(out, data)
            finally:
                os.close(out)
    finally:
        os.close(fd)
    return tmp


def _blob(repo: pygit2.Repository, index: pygit2.Index, name: str, data: bytes) -> pygit2.Oid:
    """The blob of `data`. A small file unchanged since HEAD (`index` holds HEAD's tree) is not written again:
    libgit2 stages every blob as a temp file before it finds the object already there."""
    if len(data) <= _SAME_MAX and name in index:
        known = index[name].id
        if pygit2.hash(data) == known and repo.odb.exists(known):
            return known
    return repo.create_blob(data)


@cache
def boot_id() -> str:
    """This boot's id (Linux; elsewhere the boot time to ten seconds): a power cut is followed by another."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return str(round(time.time() - time.monotonic(), -1))


def _hand_files(repo: pygit2.Repository, root: Path) -> Iterator[str]:
    """The namespace's files as a person left them, but git's and the store's own (whatever `.gitignore`
    says: a person may have emptied it) and those it ignores."""
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        dirs[:] = [d for d in dirs if d != ".git" and d not in _OWN_DIRS]
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]  # committed as links, not walked
        for name in [*files, *links]:
            path = name if rel == "." else f"{rel}/{name}"
            if not _own(path) and not repo.path_is_ignored(path):
                yield path


def _own(path: str) -> bool:
    """A path of the store's own files, which no commit holds."""
    *folders, name = path.split("/")
    return name.endswith(".tmp") or not _OWN_DIRS.isdisjoint(folders)


def _note(checked: dict[str, str], ns: Namespace) -> None:
    """Note `ns` as checked in this boot (bounded: a long-lived process sees every namespace)."""
    if len(checked) > 4096:
        checked.clear()
    checked[str(ns)] = boot_id()


BOOT = "boot"  # `written.json`: the boot of the last batch; a first batch in another boot checks git first


def cut_objects(base: Path, git: Path) -> list[str]:
    """The loose objects of the repository `git` that a crash cut short (`Store.mend` drops them)."""
    objects = git / "objects"
    return [oid for oid in _loose_objects(objects) if not _loose_whole(base, objects, oid)]


def _loose_whole(base: Path, objects: Path, oid: str) -> bool:
    """Whether a loose object is whole: it inflates to `kind size\\0` and `size` bytes whose SHA-1 is `oid`
    (one packed since it was listed is; a read that fails otherwise is an error, not a cut object)."""
    try:
        raw = read_beneath(base, objects / oid[:2] / oid[2:])
    except FileNotFoundError:
        return True
    stream = zlib.decompressobj()
    try:
        data = stream.decompress(raw)
    except zlib.error:
        return False
    head, nul, body = data.partition(b"\0")
    kind, _, size = head.partition(b" ")
    return (
        stream.eof
        and bool(nul)
        and kind in (b"blob", b"tree", b"commit", b"tag")
        and size.isdigit()
        and int(size) == len(body)
        and hashlib.sha1(data).hexdigest() == oid
    )


def _mend_skeleton(base: Path, git: Path) -> bool:
    """Write HEAD and config again where a power cut left them empty (or zeros), and drop an index whose
    checksum fails (derived: the next commit writes it); returns whether anything was."""
    mended = False
    for name, data in _SKELETON_FILES:
        try:
            now = read_beneath(base, git / name)
        except FileNotFoundError:
            now = b""
        if not now.strip(b"\0"):
            atomic_write(base, git / name, data)
            mended = True
    with contextlib.suppress(FileNotFoundError):
        index = read_beneath(base, git / "index")
        if len(index) < 32 or hashlib.sha1(index[:-20]).digest() != index[-20:]:
            os.unlink(git / "index")
            mended = True
    return mended


def _whole_tip(base: Path, repo: pygit2.Repository, objects: Path) -> tuple[pygit2.Oid | None, list[str]]:
    """The newest commit that is whole with all its history: HEAD's if it is (or one down a line from it the
    branch's lost moves had reached: `_ahead`), else the deepest such commit
    no other one descends from; and the loose commits and trees that are not. Every loose object left is
    whole and a packed commit comes with all it reaches (packs are synced, a commit's objects are never
    newer than it, and `mend` drops the loose ones that are not whole before they are packed), so only
    loose commits are walked."""
    loose = set(_loose_objects(objects))
    known: dict[pygit2.Oid, bool] = {}

    def whole(start: pygit2.Oid) -> bool:  # iterative: a namespace that could not pack has long loose lines
        todo = [start]
        while todo:
            oid = todo[-1]
            if oid in known:
                todo.pop()
                continue
            if not repo.odb.exists(oid) or str(oid) not in loose:
                known[oid] = repo.odb.exists(oid)
                continue
            commit = repo[oid]
            if not isinstance(commit, pygit2.Commit) or not _tree_whole(repo, commit.tree_id):
                known[oid] = False
                continue
            waiting = [p for p in commit.parent_ids if p not in known]
            if waiting:
                todo.extend(waiting)
            else:
                known[oid] = all(known[p] for p in commit.parent_ids)
        return known[start]

    broken = []
    for hex_id in loose:
        kind = repo.odb.read_header(hex_id)[0]
        oid = pygit2.Oid(hex=hex_id)
        if (kind == pygit2.enums.ObjectType.COMMIT and not whole(oid)) or (
            kind == pygit2.enums.ObjectType.TREE and not _tree_whole(repo, oid)
        ):
            broken.append(hex_id)
    head = _head_target(repo)
    if head is not None and whole(head):
        return _ahead(repo, loose, head, whole), broken
    ids = list(loose)
    for pack in (objects / "pack").glob("pack-*.pack"):
        ids.extend(_pack_ids(base, pack))
    commits: dict[pygit2.Oid, pygit2.Commit] = {}
    for hex_id in ids:
        oid = pygit2.Oid(hex=hex_id)
        if repo.odb.read_header(oid)[0] == pygit2.enums.ObjectType.COMMIT and whole(oid):
            commits[oid] = repo[oid].peel(pygit2.Commit)
    depth: dict[pygit2.Oid, int] = {}

    def deep(oid: pygit2.Oid) -> int:
        """Commits on its first-parent line (memoised, iterative: histories are long)."""
        line: list[pygit2.Oid] = []
        at: pygit2.Oid | None = oid
        while at is not None and at not in depth:
            line.append(at)
            first = commits[at].parent_ids if at in commits else []
            at = first[0] if first else None
        n = depth[at] if at is not None else -1
        for step in reversed(line):
            n += 1
            depth[step] = n
        return depth[oid]

    parents = {p for c in commits.values() for p in c.parent_ids}
    tips = [c for c in commits.values() if c.id not in parents]
    return max(tips, key=lambda c: (deep(c.id), c.commit_time, str(c.id))).id if tips else None, broken


def _ahead(
    repo: pygit2.Repository, loose: set[str], head: pygit2.Oid, whole: Callable[[pygit2.Oid], bool]
) -> pygit2.Oid:
    """The whole loose commit furthest down a line from `head`: the branch's moves a power cut lost (the ref
    is not synced) are found again, so no commit made before the cut drops out of history. A commit that
    only forks from an ancestor (an amended or abandoned one) is not on such a line."""
    best, steps, newest = head, 0, 0
    for hex_id in loose:
        oid = pygit2.Oid(hex=hex_id)
        if repo.odb.read_header(oid)[0] != pygit2.enums.ObjectType.COMMIT or not whole(oid):
            continue
        commit, n = repo[oid].peel(pygit2.Commit), 0
        at = commit
        while at.id != head and str(at.id) in loose and at.parent_ids and n <= len(loose):
            at, n = repo[at.parent_ids[0]].peel(pygit2.Commit), n + 1
        if at.id == head and (n, commit.commit_time) > (steps, newest):
            best, steps, newest = oid, n, commit.commit_time
    return best


def _head_target(repo: pygit2.Repository) -> pygit2.Oid | None:
    """The commit id the branch names, whether or not that object is there."""
    try:
        target = repo.references["HEAD"].resolve().target
    except (KeyError, pygit2.GitError):
        return None
    return target if isinstance(target, pygit2.Oid) else None


def _tree_whole(repo: pygit2.Repository, tree: pygit2.Oid) -> bool:
    if not repo.odb.exists(tree):
        return False
    for entry in repo[tree].peel(pygit2.Tree):
        if entry.filemode == pygit2.enums.FileMode.TREE:
            if not _tree_whole(repo, entry.id):
                return False
        elif not repo.odb.exists(entry.id):
            return False
    return True


def _branch(repo: pygit2.Repository) -> str:
    """The ref HEAD names (refs/heads/main), whether or not it has a commit yet."""
    target = repo.references["HEAD"].target
    return target if isinstance(target, str) else "refs/heads/main"


def _subject(commit: pygit2.Commit) -> str:
    """Git's %s: the first paragraph of the message on one line."""
    return " ".join(commit.message.strip().split("\n\n", 1)[0].split())


def _iso(sig: pygit2.Signature) -> str:
    tz = timezone(timedelta(minutes=sig.offset))
    return datetime.fromtimestamp(sig.time, tz).isoformat()


def _entry_id(tree: pygit2.Tree | None, name: str) -> str | None:
    if tree is None or name not in tree:
        return None
    return str(tree[name].id)


def _size(objects: Path, oids: list[str]) -> int:
    total = 0
    for oid in oids:
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(objects / oid[:2] / oid[2:]).st_size
    return total


def _pack_ids(base: Path, pack: Path) -> list[str]:
    """The object ids of a pack, from its index (version 2: magic, version, fan-out, sorted ids)."""
    data = read_beneath(base, pack.with_suffix(".idx"))
    if data[:8] != b"\xfftOc\x00\x00\x00\x02":
        raise StoreError(f"unsupported pack index {pack.with_suffix('.idx')}")
    count = int.from_bytes(data[8 + 255 * 4 : 8 + 256 * 4], "big")
    start = 8 + 256 * 4
    return [data[start + 20 * i : start + 20 * (i + 1)].hex() for i in range(count)]


def _loose_objects(objects: Path) -> list[str]:
    out: list[str] = []
    if not objects.is_dir():
        return out
    with os.scandir(objects) as fan:
        for d in fan:
            if len(d.name) == 2 and d.is_dir(follow_symlinks=False):
                out.extend(d.name + f.name for f in os.scandir(d.path) if len(f.name) == 38)
    return out


def _os_message(exc: OSError, root: AnyPath) -> str:
    if exc.errno == errno.ENOSPC:
        return f"disk full while writing under {root}: nothing was changed; free space and retry"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write under {root} ({exc.strerror}): check the data directory's permissions"
    return f"write under {root} failed: {exc.strerror or exc}"
