"""Deployment: the compose file validates without a Docker engine, and the image's entry points run as
plain processes — `lucid serve` (embedded Redis, worker, cron, webhook; no orphans on SIGTERM), `lucid bot`,
`lucid worker --burst` and `lucid cron` against a real Redis."""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LUCID_", "REDIS_URL"))}
    env.update(extra)
    return env


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


def test_compose_file_is_valid(tmp_path: Path) -> None:
    for name in ("docker-compose.yml", "Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    shutil.copy(ROOT / "lucid.toml.example", tmp_path / "lucid.toml")
    compose = shutil.which("docker-compose", path=str(Path(sys.executable).parent)) or "docker-compose"
    out = subprocess.run([compose, "config", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    services = subprocess.run(
        [compose, "config", "--services"], cwd=tmp_path, capture_output=True, text=True
    ).stdout
    assert set(services.split()) == {"redis", "bot", "worker", "cron"}
    with_ollama = subprocess.run(
        [compose, "--profile", "ollama", "config", "--services"], cwd=tmp_path, capture_output=True, text=True
    ).stdout
    assert "ollama" in with_ollama.split()


def test_serve_runs_everything_and_leaves_no_orphans(tmp_path: Path) -> None:
    port = _free_port()
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve", "--data", str(data)],
        cwd=ROOT,
        env=_env(LUCID_PORT=str(port), LUCID_CONFIG=str(tmp_path / "none.toml")),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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
    assert f"http://127.0.0.1:{port}/feishu/default/events" in out and "lucid chat" in out
    time.sleep(0.5)
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_compose_roles_run_as_plain_processes(tmp_path: Path, redis_url: str) -> None:
    port = _free_port()
    env = _env(
        REDIS_URL=redis_url,
        LUCID_DATA=str(tmp_path / "data"),
        LUCID_PORT=str(port),
        LUCID_CONFIG=str(tmp_path / "none.toml"),
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
