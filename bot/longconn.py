"""Feishu's long connection (`mode = "ws"`): lark-oapi's WebSocket client, a watchdog and one reconnect
owner, feeding the webhook's own `accept_event` (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import lark_oapi as lark
import lark_oapi.ws.client as sdk_ws
import requests
from lark_oapi.core.const import UTF_8
from lark_oapi.core.json import JSON
from lark_oapi.ws.const import GEN_ENDPOINT_URI, INTERNAL_ERROR, OK, SYSTEM_BUSY
from lark_oapi.ws.exception import ClientException, ServerException
from lark_oapi.ws.model import EndpointResp

from bot.routing import loads_event
from workers.errors import Rejected
from workers.settings import Persona

log = logging.getLogger(__name__)

ENDPOINT_TIMEOUT = 10.0  # seconds for the endpoint POST (the SDK waits for ever)
WATCH_PINGS = 3  # ping intervals without any frame before the socket counts as dead
MIN_SILENCE = 3.0  # seconds: never declare a socket dead sooner than this
ACK_WITHIN = 2.5  # seconds the handler may take (Feishu re-pushes after 3)
MAX_BACKOFF = 60.0


class _Client(lark.ws.Client):  # type: ignore[misc]
    """The SDK client, plus a clock of the last frame and an endpoint POST that cannot hang."""

    last_frame: float = 0.0

    async def _handle_message(self, msg: bytes) -> None:
        self.last_frame = time.monotonic()
        await super()._handle_message(msg)

    def _get_conn_url(self) -> str:
        """The SDK's endpoint discovery (lark_oapi/ws/client.py), with a timeout on the POST."""
        if not self._app_id or not self._app_secret:
            raise ClientException(0, "app_id and app_secret are required for the long connection")
        response = requests.post(
            self._domain + GEN_ENDPOINT_URI,
            headers={**self._headers, "locale": "zh", "User-Agent": self._user_agent},
            json={"AppID": self._app_id, "AppSecret": self._app_secret},
            timeout=ENDPOINT_TIMEOUT,
        )
        if response.status_code != http.HTTPStatus.OK:
            raise ServerException(response.status_code, "endpoint refused")
        resp = JSON.unmarshal(str(response.content, UTF_8), EndpointResp)
        if resp.code in (SYSTEM_BUSY, INTERNAL_ERROR):
            raise ServerException(resp.code, resp.msg or "system busy")
        if resp.code != OK or resp.data is None or not resp.data.URL:
            raise ClientException(resp.code, resp.msg or "no endpoint")
        if resp.data.ClientConfig is not None:
            self._configure(resp.data.ClientConfig)
        return str(resp.data.URL)

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def silence_allowed(self) -> float:
        return max(MIN_SILENCE, WATCH_PINGS * float(self._ping_interval or 0))

    def abort(self) -> None:
        """Drop the socket at once; the receive loop then fails and the supervisor reconnects."""
        conn = self._conn
        transport = getattr(conn, "transport", None)
        if transport is not None:
            transport.abort()


class _Events:
    """What the SDK calls for each event frame; raising makes it acknowledge 500 (Feishu pushes again)."""

    def __init__(self, deliver: Callable[[bytes], None]) -> None:
        self._deliver = deliver

    def _do_without_validation(self, payload: bytes) -> None:
        self._deliver(payload)


@dataclass
class Link:
    """One persona's connection, as /readyz and /metrics report it."""

    persona: str
    client: _Client
    connects: int = 0
    last_error: str = ""
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def connected(self) -> bool:
        return self.client.connected


class LongConnections:
    """The ws personas' connections, on their own thread and loop; `accept` runs on the app's loop."""

    def __init__(
        self,
        personas: list[Persona],
        domain: str,
        accept: Callable[[str, dict[str, Any]], Any],
        on_reconnect: Callable[[str], None] = lambda persona: None,
        check_every: float = 0.5,
    ) -> None:
        self.domain = domain
        self.accept = accept  # async (persona, event) -> HTTP-like status
        self.on_reconnect = on_reconnect
        self.check_every = check_every
        self.links: dict[str, Link] = {}
        self._personas = personas
        self._app_loop: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    def start(self, app_loop: asyncio.AbstractEventLoop) -> None:
        if not self._personas:
            return
        self._app_loop = app_loop
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="lucid-ws", daemon=True)
        self._thread.start()
        ready.wait(10)

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is None or stop is None or self._thread is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(10)

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        sdk_ws.loop = loop  # the SDK schedules its tasks on this module global
        self._loop = loop
        self._stop = asyncio.Event()
        for persona in self._personas:
            client = _Client(
                persona.app_id,
                persona.app_secret,
                log_level=lark.LogLevel.WARNING,
                event_handler=_Events(self._deliverer(persona.name)),
                domain=persona.api_domain(self.domain),
                auto_reconnect=False,
            )
            self.links[persona.name] = Link(persona.name, client)
        ready.set()
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        assert self._stop is not None
        loop = asyncio.get_running_loop()
        pings = []
        for link in self.links.values():
            link.task = loop.create_task(self._supervise(link))
            pings.append(loop.create_task(link.client._ping_loop()))
        await self._stop.wait()
        for task in [*(link.task for link in self.links.values() if link.task), *pings]:
            task.cancel()
        for link in self.links.values():
            with contextlib.suppress(Exception):
                await link.client._disconnect()

    async def _supervise(self, link: Link) -> None:
        """Keep one connection up for ever: connect with backoff, abort a socket that went silent."""
        client, delay = link.client, 1.0
        while True:
            if not client.connected:
                try:
                    await client._connect()
                except Exception as exc:  # bad credentials, Feishu unreachable, handshake refused
                    link.last_error = f"{type(exc).__name__}: {exc}"[:200]
                    log.warning("persona %s: long connection failed (%s); retry in %.0fs", link.persona,
                                link.last_error, delay)  # fmt: skip
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, MAX_BACKOFF)
                    continue
                delay = 1.0
                client.last_frame = time.monotonic()
                link.connects += 1
                if link.connects > 1:
                    self.on_reconnect(link.persona)
                log.info("persona %s: long connection up (connection %d)", link.persona, link.connects)
            elif time.monotonic() - client.last_frame > client.silence_allowed():
                log.warning(
                    "persona %s: no frame from Feishu for %.0fs; the socket is dead, reconnecting",
                    link.persona,
                    time.monotonic() - client.last_frame,
                )
                client.abort()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client._disconnect(), 5)
                continue
            await asyncio.sleep(self.check_every)

    def _deliverer(self, persona: str) -> Callable[[bytes], None]:
        def deliver(payload: bytes) -> None:
            try:
                event = loads_event(payload)
            except Rejected as exc:
                log.warning("persona %s: long-connection frame ignored (%s)", persona, exc.reason)
                return  # acknowledged: a re-push of the same bytes would not read any better
            if self._app_loop is None:
                return
            future = asyncio.run_coroutine_threadsafe(self.accept(persona, event), self._app_loop)
            try:
                status = future.result(ACK_WITHIN)
            except FutureTimeout as exc:
                future.cancel()
                raise RuntimeError("enqueue took too long") from exc
            if status >= 500:
                raise RuntimeError(f"not accepted now ({status}): Feishu will push it again")

        return deliver

    def state(self) -> dict[str, bool]:
        return {name: link.connected for name, link in self.links.items()}
