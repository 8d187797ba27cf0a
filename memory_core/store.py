"""The store: the one module that reads and writes a namespace's files and its git repository.

Layout of a namespace directory (DESIGN §2):

    MEMORY.md  ARCHIVE.md  PROFILE.md  DREAMS.md  raw/YYYY-MM-DD.md  .git/
    .lucid/    (not in git) state.json — hashes of what the writer last wrote, to tell hand edits apart;
               fence — the newest fencing token; journal.json — a batch between its write and its commit.

Every whole-file write is temp file + fsync + `os.replace` (+ fsync of the directory), so a reader or a
crash sees each file either before or after a batch, never torn. `replace_files` runs only while the
caller's fencing check passes, under a host-wide `flock`, so a writer whose lease expired while it was
paused cannot overwrite the new holder's write.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import stat
import subprocess
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .errors import LeaseLost, StoreError, UnsafePath
from .lineformat import RawMessage, parse_raw, render_raw
from .namespace import Namespace

log = logging.getLogger(__name__)

MEMORY = "MEMORY.md"
ARCHIVE = "ARCHIVE.md"
PROFILE = "PROFILE.md"
DREAMS = "DREAMS.md"
TRACKED = (MEMORY, ARCHIVE, PROFILE, DREAMS)
_GITIGNORE = ".lucid/\n*.tmp\n.index/\n.vault/\n"
_RAW_ID = re.compile(r"<!--r:id=([^;>]*)")


def no_symlink(base: Path, path: Path) -> Path:
    """`path`, once no component of it below `base` is a symbolic link (missing components are fine).

    The one symlink rule (issue 15): a link planted in a namespace (`raw/`, `MEMORY.md`, `.vault/…`,
    `.index/`) would make a write land, or a read come from, outside the data directory. `base` itself may
    be a link: that is the operator's choice of where the data lives. Raises UnsafePath."""
    try:
        rel = path.relative_to(base)
    except ValueError as exc:
        raise UnsafePath(f"{path} is outside the data directory {base}") from exc
    if ".." in rel.parts:
        raise UnsafePath(f"{path} leaves the data directory {base}")
    current = base
    for part in rel.parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            break
        except NotADirectoryError as exc:
            raise UnsafePath(f"{current.parent} is not a directory") from exc
        if stat.S_ISLNK(mode):
            raise UnsafePath(
                f"refusing to follow a symbolic link: {current} points to {os.readlink(current)!r}; "
                "replace it with a real file or directory (Lucid never reads or writes through a link)"
            )
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write `data` to `path` so that readers and crashes see the old or the new file, never a mix.

    `durable=False` skips the directory fsync: for derived bookkeeping (state, journal) whose loss after
    a power cut only makes the next batch re-check the files, never loses or tears memory."""
    tmp = _stage(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(path.parent)


def _stage(path: Path, data: bytes) -> str:
    """Write `data` to a synced temp file beside `path`; the caller renames it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """A host-wide exclusive lock on `path` (released by the kernel if the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"refusing to follow a symbolic link: {path}") from exc
        raise
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

    def text(self, name: str) -> str | None:
        data = self.files.get(name)
        return None if data is None else data.decode("utf-8", errors="surrogateescape")

    @property
    def version(self) -> str:
        """A hash over every tracked file: it moves whenever anything a batch depends on changes."""
        return version_of({n: _sha(d) for n, d in self.files.items() if d is not None})

    def hand_edited(self) -> list[str]:
        """Files whose content differs from what the writer last wrote (a person edited them)."""
        edited = []
        for name in TRACKED:
            data = self.files.get(name)
            if data is None:
                continue
            if self.recorded.get(name) != _sha(data):
                edited.append(name)
        return edited


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

    # -------------------------------------------------------------------------------------- paths

    def path(self, ns: Namespace) -> Path:
        return ns.path(self.data_dir)

    def file(self, ns: Namespace, *parts: str) -> Path:
        """A path in the namespace, refused (UnsafePath) if it or a folder on the way is a symbolic link."""
        return no_symlink(self.data_dir, self.path(ns).joinpath(*parts))

    def _meta(self, ns: Namespace, name: str) -> Path:
        return self.file(ns, ".lucid", name)

    def lock_path(self, ns: Namespace) -> Path:
        return self._meta(ns, "writer.lock")

    # -------------------------------------------------------------------------------------- reading

    def snapshot(self, ns: Namespace) -> Snapshot:
        files: dict[str, bytes | None] = {}
        for name in TRACKED:
            try:
                files[name] = self.file(ns, name).read_bytes()
            except FileNotFoundError:
                files[name] = None
        return Snapshot(files, self._read_state(ns).get("hashes", {}))

    def read_text(self, ns: Namespace, name: str) -> str | None:
        try:
            return self.file(ns, name).read_text("utf-8", errors="surrogateescape")
        except FileNotFoundError:
            return None

    def _read_state(self, ns: Namespace) -> dict[str, Any]:
        try:
            data = json.loads(self._meta(ns, "state.json").read_text("utf-8"))
            return data if isinstance(data, dict) else {}
        except (FileNotFoundError, ValueError):
            return {}

    def _update_state(self, ns: Namespace, **values: Any) -> None:
        # Read-modify-write under a lock: the writer (hashes) and jobs (watermarks) both update it.
        with flocked(self._meta(ns, "state.lock")):
            state = self._read_state(ns)
            state.update(values)
            atomic_write(
                self._meta(ns, "state.json"), json.dumps(state, sort_keys=True).encode(), durable=False
            )

    def _write_state(self, ns: Namespace, hashes: Mapping[str, str]) -> None:
        self._update_state(ns, hashes=dict(hashes))

    def state_value(self, ns: Namespace, key: str) -> Any:
        """A small persisted value of the namespace (phase watermarks, last-run times); not in git."""
        return self._read_state(ns).get(key)

    def set_state_value(self, ns: Namespace, key: str, value: Any) -> None:
        if key == "hashes":
            raise ValueError("hashes belong to the writer")
        self._update_state(ns, **{key: value})

    # -------------------------------------------------------------------------------------- fencing

    def read_fence(self, ns: Namespace) -> int:
        try:
            return int(self._meta(ns, "fence").read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def claim_fence(self, ns: Namespace, token: int) -> None:
        """Record `token` as the newest; this fences every older holder out at once. Idempotent for the
        holder of `token` (a leader claims once per batch it runs)."""
        with flocked(self._meta(ns, "fence.lock")):
            current = self.read_fence(ns)
            if token < current:
                raise LeaseLost(f"fencing token {token} is older than {current}")
            if token > current:  # equal: this holder already claimed it (tokens are unique per lease)
                atomic_write(self._meta(ns, "fence"), str(token).encode())

    @contextlib.contextmanager
    def fenced(self, ns: Namespace, token: int, still_held: Callable[[], bool]) -> Iterator[None]:
        """Hold the fence lock while the body replaces files; refuse if the token is stale."""
        with flocked(self._meta(ns, "fence.lock")):
            current = self.read_fence(ns)
            if current != token or not still_held():
                raise LeaseLost(f"write refused: fencing token {token} is stale (current {current})")
            yield

    # -------------------------------------------------------------------------------------- writing

    def replace_files(
        self,
        ns: Namespace,
        before: Snapshot,
        files: Mapping[str, str],
        raw: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """Write the changed tracked files and raw day files atomically (caller holds `fenced`).

        The ARCHIVE is written before MEMORY so that a crash between the two duplicates an entry rather
        than losing it. Returns the new hashes of every tracked file. Raises ConcurrentChange (a
        StoreError) if a tracked file changed on disk since `before` was read: a hand edit raced us.
        """
        root = self.file(ns)
        root.mkdir(parents=True, exist_ok=True)
        for name in TRACKED:
            path = self.file(ns, name)
            now = path.read_bytes() if path.exists() else None
            if now != before.files.get(name):
                raise ConcurrentChange(name)
        hashes = {n: _sha(d) for n, d in before.files.items() if d is not None}
        # Stage every temp file first: ENOSPC or EACCES then hits before any file is replaced.
        writes: list[tuple[Path, bytes]] = [
            (self.file(ns, "raw", name), content.encode("utf-8", errors="surrogateescape"))
            for name, content in (raw or {}).items()
        ]
        for name in (ARCHIVE, PROFILE, DREAMS, MEMORY):
            if name in files:
                data = files[name].encode("utf-8", errors="surrogateescape")
                hashes[name] = _sha(data)
                if data != before.files.get(name):
                    writes.append((self.file(ns, name), data))
        staged: list[tuple[str, Path]] = []
        try:
            for path, data in writes:
                staged.append((_stage(path, data), path))
            for tmp, path in staged:
                os.replace(tmp, path)
            for directory in {path.parent for _, path in staged}:
                _fsync_dir(directory)
        except OSError as exc:
            for tmp, _ in staged:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise StoreError(_os_message(exc, root)) from exc
        return hashes

    def record_hashes(self, ns: Namespace, hashes: Mapping[str, str]) -> None:
        self._write_state(ns, hashes)

    # ---------------------------------------------------------------------------- journal (crash window)

    def write_journal(self, ns: Namespace, journal: Mapping[str, Any]) -> None:
        atomic_write(self._meta(ns, "journal.json"), json.dumps(journal).encode(), durable=False)

    def read_journal(self, ns: Namespace) -> dict[str, Any] | None:
        try:
            data = json.loads(self._meta(ns, "journal.json").read_text("utf-8"))
            return data if isinstance(data, dict) else None
        except (FileNotFoundError, ValueError):
            return None

    def clear_journal(self, ns: Namespace) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._meta(ns, "journal.json").unlink()

    def set_aside(self, ns: Namespace, name: str, line: str) -> str:
        """Keep a hand-edited line too long to be memory, verbatim, out of the files and out of git (private
        state, mode 0600). Returns where, relative to the namespace."""
        data = line.encode("utf-8", errors="surrogateescape")
        where = f".lucid/set-aside/{Path(name).stem}-{_sha(data)[:12]}.txt"
        path = self.file(ns, *where.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(path, data)
        return where

    # -------------------------------------------------------------------------------------- vault

    def append_vault(self, ns: Namespace, lines: list[str]) -> None:
        """Append sealed (encrypted) records to the namespace's vault; never in git (.gitignore)."""
        path = self.file(ns, ".vault", "secrets.enc")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, "".join(line + "\n" for line in lines).encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_vault(self, ns: Namespace) -> list[str]:
        path = self.file(ns, ".vault", "secrets.enc")
        return path.read_text().split() if path.exists() else []

    # -------------------------------------------------------------------------------------- raw archive

    def raw_day_name(self, when: datetime) -> str:
        return f"{when:%Y-%m-%d}.md"

    def raw_ids(self, ns: Namespace, day_name: str) -> set[str]:
        text = self.read_text_raw(ns, day_name)
        return {unquote(i) for i in _RAW_ID.findall(text)} if text else set()

    def read_text_raw(self, ns: Namespace, day_name: str) -> str | None:
        try:
            return self.file(ns, "raw", day_name).read_text("utf-8", errors="surrogateescape")
        except FileNotFoundError:
            return None

    def raw_days(self, ns: Namespace) -> list[str]:
        raw = self.file(ns, "raw")
        if not raw.is_dir():
            return []
        return sorted(p.name for p in raw.iterdir() if re.fullmatch(r"\d{4}-\d{2}-\d{2}\.md", p.name))

    def iter_raw(self, ns: Namespace, days: list[str] | None = None) -> Iterator[RawMessage]:
        """Every readable message of the raw archive, in file order (unreadable lines are skipped)."""
        from .lineformat import LineError

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

    # -------------------------------------------------------------------------------------- git

    def _git(
        self, ns: Namespace, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        env.update(
            GIT_AUTHOR_NAME="Lucid",
            GIT_AUTHOR_EMAIL="lucid@localhost",
            GIT_COMMITTER_NAME="Lucid",
            GIT_COMMITTER_EMAIL="lucid@localhost",
            GIT_CONFIG_NOSYSTEM="1",
            GIT_CONFIG_GLOBAL=os.devnull,
        )
        try:
            return subprocess.run(
                ["git", "-C", str(self.path(ns)), *args],
                capture_output=True,
                text=True,
                env=env,
                check=check,
                timeout=60,
                input=stdin,
            )
        except FileNotFoundError as exc:
            raise StoreError("git is not installed: install git, or run with git disabled") from exc
        except subprocess.CalledProcessError as exc:
            raise StoreError(f"git {args[0]} failed: {exc.stderr.strip()[:300]}") from exc

    def ensure_repo(self, ns: Namespace) -> None:
        root = self.file(ns)
        root.mkdir(parents=True, exist_ok=True)
        if not self.git_enabled or self.file(ns, ".git").exists():
            return
        self._git(ns, "init", "-q", "-b", "main")
        atomic_write(self.file(ns, ".gitignore"), _GITIGNORE.encode())

    def commit(
        self, ns: Namespace, message: str, exact: Mapping[str, bytes | None] | None = None
    ) -> str | None:
        """Commit the namespace; returns the new short revision, or None if nothing changed.

        With `exact`, the tracked files are committed with exactly those bytes (what the writer wrote),
        not whatever is on disk now: a person's edit that lands between our rename and this commit stays
        uncommitted, so the next batch sees it and commits it as its own `manual edit`."""
        if not self.git_enabled:
            return None
        self.ensure_repo(ns)
        for inside in ("objects", "refs", "index", "HEAD"):  # where git itself writes
            self.file(ns, ".git", inside)
        if exact is None:
            self._git(ns, "add", "-A")
        else:
            rows = [
                f"100644 {self._write_blob(ns, data)}\t{name}"
                for name, data in exact.items()
                if data is not None
            ]
            if (self.path(ns) / ".gitignore").exists():
                rows.append(f"100644 {self._write_blob(ns, _GITIGNORE.encode())}\t.gitignore")
            if rows:
                self._git(ns, "update-index", "--add", "--index-info", stdin="\n".join(rows) + "\n")
        done = self._git(ns, "commit", "--no-verify", "--no-status", "-m", message, check=False)
        if done.returncode != 0:
            if (
                "nothing to commit" in done.stdout
                or "nothing added" in done.stdout
                or "no changes added" in done.stdout
            ):
                return None
            raise StoreError(f"git commit failed: {(done.stderr or done.stdout).strip()[:300]}")
        m = re.search(r"\[[^\]]*?([0-9a-f]{7,40})\]", done.stdout)
        return m.group(1) if m else None

    def _write_blob(self, ns: Namespace, data: bytes) -> str:
        """Store `data` as a loose git blob (the standard object format) and return its id."""
        raw = b"blob %d\0" % len(data) + data
        sha = hashlib.sha1(raw).hexdigest()
        path = self.file(ns, ".git", "objects", sha[:2], sha[2:])
        if not path.exists():
            atomic_write(path, zlib.compress(raw, 1), durable=False)
        return sha

    def committed_text(self, ns: Namespace, name: str) -> str | None:
        """`name` as of the namespace's last commit (None: no git, no commit, or not in it)."""
        if not self.git_enabled or not (self.path(ns) / ".git").exists():
            return None
        done = self._git(ns, "show", f"HEAD:{name}", check=False)
        return done.stdout if done.returncode == 0 else None

    def history(self, ns: Namespace, limit: int = 50) -> list[dict[str, str]]:
        if not (self.path(ns) / ".git").exists():
            return []
        out = self._git(ns, "log", f"-n{limit}", "--format=%H%x1f%aI%x1f%s", check=False).stdout
        rows = []
        for line in out.splitlines():
            rev, when, subject = ([*line.split("\x1f"), "", ""])[:3]
            rows.append({"rev": rev, "time": when, "message": subject})
        return rows

    def show(self, ns: Namespace, rev: str, limit: int = 20_000) -> str:
        """The diff one commit made to the tracked files (for the viewer's dream journal)."""
        if not re.fullmatch(r"[0-9a-fA-F]{4,40}", rev):
            raise StoreError(f"not a revision: {rev!r}")
        out = self._git(ns, "show", "--format=", "--unified=0", rev, "--", *TRACKED, check=False).stdout
        return out if len(out) <= limit else out[:limit] + "\n… (diff cut)"

    def resolve(self, ns: Namespace, rev: str) -> str:
        """The full id of commit `rev` (a hex prefix, or HEAD / HEAD~N). Raises StoreError if none."""
        if not re.fullmatch(r"[0-9a-fA-F]{4,40}|HEAD(~\d+)?", rev):
            raise StoreError(f"not a revision: {rev!r}")
        if not (self.path(ns) / ".git").exists():
            raise StoreError(f"no history for {ns} yet")
        found = self._git(ns, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
        if found.returncode != 0:
            raise StoreError(f"no commit {rev!r} in the history of {ns} (see `lucid history`)")
        return found.stdout.strip()

    def subject(self, ns: Namespace, rev: str) -> str:
        return self._git(ns, "log", "-1", "--format=%s", rev).stdout.strip()

    def files_at(self, ns: Namespace, rev: str) -> dict[str, str | None]:
        """The tracked files as commit `rev` had them (None: absent, or no such commit — `root^`)."""
        out: dict[str, str | None] = dict.fromkeys(TRACKED)
        query = "".join(f"{rev}:{name}\n" for name in TRACKED)
        done = subprocess.run(
            ["git", "-C", str(self.path(ns)), "cat-file", "--batch"],
            input=query.encode(),
            capture_output=True,
            env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull},
            check=False,
            timeout=60,
        )
        data, pos = done.stdout, 0
        for name in TRACKED:
            end = data.index(b"\n", pos)
            header = data[pos:end].split()
            pos = end + 1
            if len(header) == 3 and header[1] == b"blob":
                size = int(header[2])
                out[name] = data[pos : pos + size].decode("utf-8", errors="surrogateescape")
                pos += size + 1
        return out

    def revisions_touching(
        self, ns: Namespace, names: tuple[str, ...], limit: int = 200
    ) -> list[tuple[str, str]]:
        """(full id, subject) of the newest commits (at most `limit`) that changed any of `names`."""
        if not (self.path(ns) / ".git").exists():
            return []
        out = self._git(ns, "log", f"-n{limit}", "--format=%H%x1f%s", "--", *names, check=False).stdout
        return [(rev, subject) for rev, _, subject in (line.partition("\x1f") for line in out.splitlines())]


class ConcurrentChange(StoreError):
    """A tracked file changed on disk between the batch's read and its write (a hand edit raced us)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} changed while the batch was being written")
        self.name = name


def _os_message(exc: OSError, root: Path) -> str:
    if exc.errno == errno.ENOSPC:
        return f"disk full while writing under {root}: nothing was changed; free space and retry"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write under {root} ({exc.strerror}): check the data directory's permissions"
    return f"write under {root} failed: {exc.strerror or exc}"
