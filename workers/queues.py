"""Every RQ queue, worker and cron job of Lucid, on one serializer that cannot execute: JSON (`JSONOnly`)."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import redis
from rq import Queue, cron_job_registry
from rq.cron import CronJob
from rq.defaults import DEFAULT_CRON_JOB_HISTORY_LIMIT, DEFAULT_CRON_JOB_HISTORY_TTL
from rq.job import Job

log = logging.getLogger(__name__)


class JSONOnly:
    """The serializer of every Lucid queue: JSON only, since RQ's default (pickle) lets whoever can write to
    Redis make a worker run any code (docs/RELIABILITY.md)."""

    @staticmethod
    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    @staticmethod
    def loads(data: bytes | str) -> Any:
        try:
            return json.loads(data)
        except (ValueError, TypeError) as exc:
            head = data[:1] if isinstance(data, bytes | str) else b""
            log.error(
                "refused a job payload that is not JSON (%s, first byte %r): Redis holds data, never code; "
                "the job fails and nothing of it runs",
                type(exc).__name__,
                head,
            )
            raise


SERIALIZER = JSONOnly


def queue(name: str, client: redis.Redis) -> Queue:
    """The RQ queue `name` ("chat", "memory", "dream") on `client`, JSON only."""
    return Queue(name, connection=client, serializer=SERIALIZER)


def extraction_job_id(persona: str, message_id: str) -> str:
    """The RQ job of one message's extraction: one per message, and found again by a forget."""
    return "extract-" + hashlib.sha1(f"{persona}:{message_id}".encode()).hexdigest()[:24]


def fetch(job_id: str, client: redis.Redis) -> Job:
    return Job.fetch(job_id, connection=client, serializer=SERIALIZER)


class JSONCronJob(CronJob):
    """rq's CronJob enqueues on a pickle queue of its own making; this one enqueues on `queue()`."""

    def enqueue(self, connection: redis.Redis) -> Job:
        assert self.func is not None
        with connection.pipeline() as pipe:
            job = queue(self.queue_name, connection).enqueue(
                self.func, args=self.args, kwargs=self.kwargs, **self.job_options, pipeline=pipe
            )
            assert job.enqueued_at is not None
            pipe.zadd(self.job_history_key, {job.id: job.enqueued_at.timestamp()})
            pipe.zremrangebyrank(self.job_history_key, 0, -(DEFAULT_CRON_JOB_HISTORY_LIMIT + 1))
            pipe.expire(self.job_history_key, DEFAULT_CRON_JOB_HISTORY_TTL)
            cron_job_registry.add(self.name, pipe, enqueue_timestamp=job.enqueued_at.timestamp())
            pipe.execute()
        return job
