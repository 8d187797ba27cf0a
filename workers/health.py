"""Container healthchecks: is this host's worker or cron process alive, as Redis sees it."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta

import redis
from rq import Worker
from rq.cron import CronScheduler

STALE = timedelta(minutes=2)


def check(client: redis.Redis, role: str, hostname: str | None = None) -> str | None:
    """None when `role` ("worker" or "cron") runs on this host and is alive, else why not."""
    host = hostname or socket.gethostname()
    try:
        if role == "worker":
            now = datetime.now(UTC)
            for w in Worker.all(connection=client):
                beat = w.last_heartbeat
                if w.hostname == host and beat and now - beat.replace(tzinfo=beat.tzinfo or UTC) < STALE:
                    return None
            return f"no live RQ worker on host {host}"
        if role == "cron":
            if any(s.hostname == host for s in CronScheduler.all(client)):
                return None
            return f"no rq cron scheduler registered from host {host}"
    except redis.RedisError as exc:
        return f"Redis unreachable ({type(exc).__name__})"
    return f"unknown role {role!r}"
