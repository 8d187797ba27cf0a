"""The embedded Redis is reachable by this user's Lucid processes only: a unix socket in a 0700 directory
(outside the data dir when its path is too long for AF_UNIX), no TCP port, and a random password kept in
0600 files — never a TCP port without a password, whatever the data directory's path."""

from __future__ import annotations

import stat
from pathlib import Path

import psutil
import pytest
import redis

from workers import embedded_redis


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("depth", [1, 12])
def test_embedded_redis_never_listens_on_tcp_and_needs_its_password(tmp_path: Path, depth: int) -> None:
    data = tmp_path.joinpath(*["a-long-directory-name"] * depth) / "data"
    data.mkdir(parents=True)
    assert depth == 1 or len(str(data)) >= 100
    server = embedded_redis.start(data, persist=False)
    try:
        assert server.process is not None and server.url.startswith("unix://")
        pid = server.process.pid
        assert psutil.Process(pid).net_connections(kind="inet") == []  # no TCP (or UDP) socket at all
        sock = Path(server.url.split("@", 1)[1])
        assert sock.exists() and stat.S_ISSOCK(sock.stat().st_mode)
        assert _mode(sock.parent) == 0o700 and _mode(sock) & 0o077 == 0
        if depth > 1:
            assert data not in sock.parents  # a short private directory instead
        with redis.Redis(unix_socket_path=str(sock)) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.ping()  # the socket alone is not enough
        with redis.Redis.from_url(server.url) as client:
            assert client.ping()
        for name in ("url", "redis.conf"):
            assert _mode(data / ".redis" / name) == 0o600
        assert embedded_redis.running_url(data) == server.url  # how the other processes find it
        again = embedded_redis.start(data, persist=False)
        assert again.url == server.url and again.process is None  # reused, not a second server
        password = server.url.split("@", 1)[0].rsplit(":", 1)[1]
        assert len(password) >= 32 and password not in " ".join(psutil.Process(pid).cmdline())  # not in ps
    finally:
        server.stop()
    if depth > 1:
        assert not sock.parent.exists()


@pytest.mark.parametrize("depth", [0, 12])
def test_a_server_that_died_comes_back_on_the_url_its_clients_hold(tmp_path: Path, depth: int) -> None:
    """Killed (OOM, SIGKILL) and started again for the same data dir, it keeps its password and socket
    (in the data dir, or in its private directory): the processes still holding the URL reconnect, with
    what the AOF kept."""
    data = tmp_path.joinpath(*["a-long-directory-name"] * depth) / "d"
    data.mkdir(parents=True)
    server = embedded_redis.start(data, persist=True)
    short = len(str(data.resolve() / ".redis" / "redis.sock")) < 100  # AF_UNIX's limit, with margin
    assert (data in Path(server.url.split("@", 1)[1]).parents) == short
    again = None
    try:
        held = redis.Redis.from_url(server.url)  # a process that keeps its client across the outage
        held.set("lucid:test", "kept")
        assert server.process is not None
        server.process.kill()
        server.process.wait()
        with pytest.raises(redis.ConnectionError):
            held.ping()
        again = embedded_redis.start(data, persist=True)
        assert again.process is not None and again.url == server.url
        assert held.get("lucid:test") == b"kept"
        held.close()
    finally:
        (again or server).stop()
