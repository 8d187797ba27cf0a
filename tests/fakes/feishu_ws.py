"""A local fake of Feishu's long-connection endpoint, speaking the SDK's frame protocol (protobuf `pbbp2.Frame`).

    with FakeFeishuWS(app_id="cli_x", app_secret="s", ping_interval=1) as ws:
        persona = Persona("p", app_id="cli_x", app_secret="s", mode="ws", domain=ws.url)
        ...                                           # the product's lark.ws.Client connects
        frame_id = ws.push(message_event("你好"))      # one event frame to one live connection
        assert ws.ack(frame_id) == 200                # the SDK's acknowledgement, after our handler

What it does as Feishu does (research/feishu.md §5; lark_oapi/ws/client.py): `POST /callback/ws/endpoint`
with `{"AppID", "AppSecret"}` answers `{"code": 0, "data": {"URL": "ws://…?device_id=…&service_id=…",
"ClientConfig": {…, "PingInterval": …}}}`, and refuses wrong credentials with a non-zero code; the socket
refuses a URL it did not hand out; a client PING control frame gets a PONG; each event is a DATA frame
(headers type=event, message_id, sum, seq, trace_id) delivered to ONE connection (Feishu's cluster mode),
optionally split into `sum` parts; the client must answer every DATA frame with the same frame whose
payload is `{"code": …}`. Anything else the client sends is recorded in `errors`.

Faults: `drop()` closes every socket from the server side; `go_silent()` keeps sockets open but answers
and sends nothing (a half-open socket as the application sees it); `speak()` undoes it; `refuse(n)`
makes the next n endpoint calls fail (Feishu unreachable).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from lark_oapi.ws.pb.pbbp2_pb2 import Frame

from tests.fakes.feishu import FakeFeishu
from tests.fakes.ollama import BackgroundServer

CONTROL, DATA = 0, 1
SERVICE_ID = 77
BAD_CREDENTIALS = 10014


@dataclass
class Connection:
    device_id: str
    socket: web.WebSocketResponse
    opened: float = field(default_factory=time.monotonic)
    pings: int = 0


class FakeFeishuWS(BackgroundServer):
    def __init__(
        self, app_id: str, app_secret: str, ping_interval: int = 1, api: FakeFeishu | None = None
    ) -> None:
        """`api`: a FakeFeishu whose open API this server answers too, so one persona domain serves both."""
        super().__init__()
        self.api = api
        self.app_id, self.app_secret, self.ping_interval = app_id, app_secret, ping_interval
        self.endpoint_calls = 0
        self.connections: list[Connection] = []  # every connection ever accepted, in order
        self.acks: dict[str, int] = {}  # frame message_id → code the client answered
        self.errors: list[str] = []
        self.silent = False
        self._refuse = 0
        self._devices: set[str] = set()
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------------------------ test API

    @property
    def live(self) -> list[Connection]:
        with self.lock:
            return [c for c in self.connections if not c.socket.closed]

    def push(self, event: dict[str, Any], parts: int = 1) -> str:
        """Send `event` as one event (in `parts` frames) to one live connection; returns its message_id.

        A message event's message becomes known to `api`, as Feishu knows what it delivers: replies to it
        are accepted there (a reply to a message Feishu never delivered is refused)."""
        message = (event.get("event") or {}).get("message") or {}
        if self.api is not None and message.get("message_id"):
            self.api.note_message(message["message_id"], message.get("chat_id", ""))
        return self.push_raw(json.dumps(event, ensure_ascii=False).encode(), parts)

    def push_raw(self, payload: bytes, parts: int = 1) -> str:
        """Send bytes as one event's payload, whatever they hold (a hostile or broken frame)."""
        message_id = f"frame_{uuid.uuid4().hex[:12]}"
        self._call(self._push(message_id, payload, parts))
        return message_id

    def ack(self, message_id: str, timeout: float = 10.0) -> int | None:
        """The code the client acknowledged the event with (None if it never did within `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if message_id in self.acks:
                    return self.acks[message_id]
            time.sleep(0.02)
        return None

    def wait_connections(self, n: int, timeout: float = 30.0) -> bool:
        """True once `n` connections were accepted in all (and the newest is open)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.connections) >= n and not self.connections[-1].socket.closed:
                    return True
            time.sleep(0.05)
        return False

    def drop(self) -> None:
        self._call(self._drop())

    def go_silent(self) -> None:
        self.silent = True

    def speak(self) -> None:
        self.silent = False

    def refuse(self, n: int) -> None:
        self._refuse = n

    # ------------------------------------------------------------------------------------ the server

    def build_app(self) -> web.Application:
        app = self.api.build_app() if self.api is not None else web.Application()
        app.router.add_post("/callback/ws/endpoint", self._endpoint)
        app.router.add_get("/ws", self._socket)
        return app

    async def _endpoint(self, request: web.Request) -> web.Response:
        self.endpoint_calls += 1
        if self._refuse > 0:
            self._refuse -= 1
            return web.json_response({"code": 1, "msg": "system busy"})
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"code": 400, "msg": "body is not JSON"}, status=400)
        if body.get("AppID") != self.app_id or body.get("AppSecret") != self.app_secret:
            return web.json_response({"code": BAD_CREDENTIALS, "msg": "app secret invalid"})
        device = f"dev_{next(self._ids)}"
        self._devices.add(device)
        host = request.host
        return web.json_response(
            {
                "code": 0,
                "msg": "ok",
                "data": {
                    "URL": f"ws://{host}/ws?device_id={device}&service_id={SERVICE_ID}",
                    "ClientConfig": {
                        "ReconnectCount": -1,
                        "ReconnectInterval": 1,
                        "ReconnectNonce": 0,
                        "PingInterval": self.ping_interval,
                    },
                },
            }
        )

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        device = request.query.get("device_id", "")
        if device not in self._devices or request.query.get("service_id") != str(SERVICE_ID):
            return web.Response(status=403, headers={"handshake-status": "403", "handshake-msg": "forbidden"})
        self._devices.discard(device)  # a URL works once, as a ticket
        sock = web.WebSocketResponse(autoping=True)
        await sock.prepare(request)
        conn = Connection(device, sock)
        with self.lock:
            self.connections.append(conn)
        async for msg in sock:
            if msg.type != WSMsgType.BINARY:
                self.errors.append(f"non-binary message {msg.type}")
                continue
            frame = Frame()
            try:
                frame.ParseFromString(msg.data)
            except Exception as exc:
                self.errors.append(f"unparsable frame: {exc}")
                continue
            await self._on_frame(conn, frame)
        return sock

    async def _on_frame(self, conn: Connection, frame: Frame) -> None:
        headers = {h.key: h.value for h in frame.headers}
        if frame.method == CONTROL and headers.get("type") == "ping":
            if frame.service != SERVICE_ID:
                self.errors.append(f"ping for service {frame.service}")
            conn.pings += 1
            if not self.silent:
                pong = Frame()
                pong.method, pong.service, pong.SeqID, pong.LogID = CONTROL, SERVICE_ID, 0, 0
                h = pong.headers.add()
                h.key, h.value = "type", "pong"
                await conn.socket.send_bytes(pong.SerializeToString())
        elif frame.method == DATA:
            try:
                code = int(json.loads(frame.payload)["code"])
            except (ValueError, KeyError, TypeError):
                self.errors.append("acknowledgement without a JSON code")
                return
            with self.lock:
                self.acks[headers.get("message_id", "")] = code
        else:
            self.errors.append(f"unexpected frame method={frame.method} type={headers.get('type')}")

    async def _push(self, message_id: str, payload: bytes, parts: int) -> None:
        live = [c for c in self.connections if not c.socket.closed]
        if not live:
            raise RuntimeError("no live long connection to deliver to")
        conn = live[-1]
        size = -(-len(payload) // parts)
        chunks = [payload[i * size : (i + 1) * size] for i in range(parts)]
        for seq, chunk in enumerate(chunks):
            frame = Frame()
            frame.method, frame.service, frame.SeqID, frame.LogID = DATA, SERVICE_ID, next(self._ids), 1
            for key, value in (
                ("type", "event"),
                ("message_id", message_id),
                ("sum", str(parts)),
                ("seq", str(seq)),
                ("trace_id", f"trace_{message_id}"),
            ):
                h = frame.headers.add()
                h.key, h.value = key, value
            frame.payload = chunk
            await conn.socket.send_bytes(frame.SerializeToString())

    async def _drop(self) -> None:
        for conn in list(self.connections):
            if not conn.socket.closed:
                await conn.socket.close()

    async def _close(self) -> None:
        await self._drop()
        await super()._close()
