"""A local fake of the Feishu open API, for tests that drive the real lark-oapi SDK.

    with FakeFeishu(bot_open_id="ou_bot") as fake:
        client = make_client(fake)                       # a real lark.Client pointed at the fake
        client.im.v1.message.reply(req)                  # sync SDK call (or asyncio.to_thread)
        assert [m.text for m in fake.sent] == ["hello"]

The fake runs in its own thread and loop (`BackgroundServer`), so it also serves async tests and the
SDK's blocking `requests` calls without deadlocks.

Endpoints: tenant token, message reply and create, reaction create and delete, bot info. Every API
call needs a token the fake issued; `expire_tokens()` invalidates all of them, so the next call gets
`99991663` until the caller fetches a new one. Sends honour `uuid`: within `uuid_ttl` seconds a uuid
seen before creates nothing and answers with the first message. Every request lands in `requests`,
every message created in `sent`, every reaction in `reactions`.

The fake refuses what Feishu refuses (research/feishu.md §3; the IM v1 create/reply and reaction docs;
each rule has a conformance test in tests/test_fakes.py):

- a reply to, or a reaction on, a message it does not know: 99992354 / 231003. It knows the messages
  it created and the inbound ones a test announces with `note_message(message_id, chat_id)`;
- a `uuid` over 50 characters, a `receive_id_type` other than open_id/union_id/user_id/email/chat_id:
  99992402 (field validation);
- content that does not fit its `msg_type`: `text` needs {"text": str}, `post` the post schema
  ({"zh_cn": {"title", "content": [[node, …], …]}} with known tags and their fields, an `md` node alone in
  its paragraph), `interactive` a card, `image` an image_key, …: 230001;
- an `emoji_type` not in Feishu's emoji list (`EMOJI_TYPES`): 231001;
- the documented rate limits, always on: 5 sends per second to one chat or user (230020), and per app
  50 per second and 1000 per minute (HTTP 429, 99991400). A test may pass other limits, never none.

Faults are scripted per endpoint and consumed one per request, in order:

    fake.fail("reply", rate_limited(), chat_rate_limited(), server_error(502), delay(2.0))

Endpoint names: "token", "reply", "create", "reaction_create", "reaction_delete", "bot_info".
A `delay()` fault only holds the request: if the client times out first, the fake still completes it,
as the real API may, which is what the `uuid` retry path has to survive. `slow(seconds)` delays every
request; `down()`/`up()` stop and restart the listener.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import lark_oapi as lark
from aiohttp import web
from lark_oapi.core.token import TokenManager

from tests.fakes.ollama import BackgroundServer

__all__ = [
    "EMOJI_TYPES",
    "ENDPOINTS",
    "RECEIVE_ID_TYPES",
    "ApiCall",
    "FakeFeishu",
    "Fault",
    "Reaction",
    "SentMessage",
    "api_error",
    "chat_rate_limited",
    "delay",
    "forget_token",
    "make_client",
    "rate_limited",
    "server_error",
    "token_invalid",
]

ENDPOINTS = ("token", "reply", "create", "reaction_create", "reaction_delete", "bot_info")

TOKEN_INVALID = 99991663
TOKEN_MISSING = 99991661
GATEWAY_RATE_LIMIT = 99991400
CHAT_RATE_LIMIT = 230020
INVALID_PARAMS = 230001
MESSAGE_RECALLED = 230011
MESSAGE_TOO_LONG = 230025
FIELD_VALIDATION = 99992402
APP_SECRET_INVALID = 10014

MESSAGE_NOT_FOUND = 99992354  # "…is not a valid {open_message_id} or not exists" (openclaw/openclaw#135404)
REACTION_TYPE_INVALID = 231001
REACTION_MESSAGE_NOT_FOUND = 231003
UUID_MAX = 50  # reply/create docs: uuid, 最大长度 50 字符
CHAT_QPS = 5.0  # per user and per group (shared by every bot in it)
APP_LIMITS = ((50, 1.0), (1000, 60.0))  # per app: 50/s and 1000/min
RECEIVE_ID_TYPES = frozenset({"open_id", "union_id", "user_id", "email", "chat_id"})
# The emoji_type column of Feishu's "表情文案说明" (im-v1/message-reaction/emojis-introduce); case matters.
_EMOJI_TABLE = """OK THUMBSUP THANKS MUSCLE FINGERHEART APPLAUSE FISTBUMP JIAYI DONE SMILE BLUSH LAUGH SMIRK LOL FACEPALM
    LOVE WINK PROUD WITTY SMART SCOWL THINKING SOB CRY ERROR NOSEPICK HAUGHTY SLAP SPITBLOOD TOASTED GLANCE
    DULL INNOCENTSMILE JOYFUL WOW TRICK YEAH ENOUGH TEARS EMBARRASSED KISS SMOOCH DROOL OBSESSED MONEY TEASE
    SHOWOFF COMFORT CLAP PRAISE STRIVE XBLUSH SILENT WAVE WHAT FROWN SHY DIZZY LOOKDOWN CHUCKLE WAIL CRAZY
    WHIMPER HUG BLUBBER WRONGED HUSKY SHHH SMUG ANGRY HAMMER SHOCKED TERROR PETRIFIED SKULL SWEAT SPEECHLESS
    SLEEP DROWSY YAWN SICK PUKE BETRAYED HEADSET EatingFood MeMeMe Sigh Typing Lemon Get LGTM OnIt OneSecond
    VRHeadset YouAreTheBest SALUTE SHAKE HIGHFIVE UPPERLEFT ThumbsDown SLIGHT TONGUE EYESCLOSED RoarForYou
    CALF BEAR BULL RAINBOWPUKE ROSE HEART PARTY LIPS BEER CAKE GIFT CUCUMBER Drumstick Pepper CANDIEDHAWS
    BubbleTea Coffee Yes No OKR CheckMark CrossMark MinusOne Hundred AWESOMEN Pin Alarm Loudspeaker Trophy
    Fire BOMB Music XmasTree Snowman XmasHat FIREWORKS 2022 REDPACKET FORTUNE LUCK FIRECRACKER
    StickyRiceBalls HEARTBROKEN POOP StatusFlashOfInspiration 18X CLEAVER Soccer Basketball
    GeneralDoNotDisturb Status_PrivateMessage GeneralInMeetingBusy StatusReading StatusInFlight
    GeneralBusinessTrip GeneralWorkFromHome StatusEnjoyLife GeneralTravellingCar StatusBus GeneralSun
    GeneralMoonRest MoonRabbit Mooncake JubilantRabbit TV Movie Pumpkin BeamingFace Delighted ColdSweat
    FullMoonFace Partying GoGoGo ThanksFace SaluteFace Shrug ClownFace HappyDragon"""
EMOJI_TYPES = frozenset(_EMOJI_TABLE.split())
# Post nodes (发送消息内容 → 富文本): tag -> the fields it requires.
_POST_TAGS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "a": ("text", "href"),
    "at": ("user_id",),
    "img": ("image_key",),
    "media": ("file_key",),
    "emotion": ("emoji_type",),
    "hr": (),
    "code_block": ("text",),
    "md": ("text",),
}
# msg_type -> the string fields its content requires (text, post and interactive are checked in full).
_KEYED_CONTENT: dict[str, tuple[str, ...]] = {
    "image": ("image_key",),
    "file": ("file_key",),
    "audio": ("file_key",),
    "media": ("file_key",),
    "sticker": ("file_key",),
    "share_chat": ("chat_id",),
    "share_user": ("user_id",),
    "system": ("type",),
}

_TEXT_LIMIT = 150 * 1024  # request body bytes for text; post and cards get 30 KB
_RICH_LIMIT = 30 * 1024


@dataclass(frozen=True)
class Fault:
    """One scripted answer for one request to an endpoint.

    If `status` is None the fault only waits `delay` seconds and the request is then handled
    normally (a client timeout shorter than the delay fires first). Otherwise, after the delay, the
    fake answers `status` with `json` (a dict) or `text` (any string, e.g. an HTML error page) and
    the extra `headers`; nothing is created.
    """

    status: int | None = None
    json: Mapping[str, Any] | None = None
    text: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0

    def response(self) -> web.Response:
        assert self.status is not None
        if self.json is not None:
            return web.json_response(dict(self.json), status=self.status, headers=dict(self.headers))
        return web.Response(status=self.status, text=self.text or "", headers=dict(self.headers))


def api_error(code: int, msg: str = "fake error", status: int = 400) -> Fault:
    """A JSON error body `{"code": code, "msg": msg}` with HTTP `status`."""
    return Fault(status=status, json={"code": code, "msg": msg})


def rate_limited(reset_seconds: int = 1, status: int = 429) -> Fault:
    """The gateway limit: HTTP 429, code 99991400 and the `x-ogw-ratelimit-*` headers."""
    headers = {"x-ogw-ratelimit-limit": "50", "x-ogw-ratelimit-reset": str(reset_seconds)}
    body = {"code": GATEWAY_RATE_LIMIT, "msg": "request trigger frequency limit"}
    return Fault(status=status, json=body, headers=headers)


def chat_rate_limited() -> Fault:
    """The per-chat / per-user limit: code 230020."""
    return api_error(CHAT_RATE_LIMIT, "This operation triggers the frequency limit.", status=400)


def token_invalid(status: int = 400) -> Fault:
    """Code 99991663 for this one request (to invalidate every issued token use `expire_tokens()`)."""
    return api_error(TOKEN_INVALID, "Invalid access token for authorization.", status=status)


def server_error(status: int = 502, text: str = "<html><body>502 Bad Gateway</body></html>") -> Fault:
    """An HTTP 5xx with a non-JSON body, as a proxy in front of the API sends."""
    return Fault(status=status, text=text, headers={"Content-Type": "text/html"})


def delay(seconds: float) -> Fault:
    """Wait, then handle the request normally."""
    return Fault(delay=seconds)


@dataclass(frozen=True)
class ApiCall:
    """One request as the fake received it (token requests included)."""

    endpoint: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    time: float


@dataclass(frozen=True)
class SentMessage:
    """A message the fake created, via reply (`parent_id` set) or create (`receive_id` set)."""

    message_id: str
    kind: str  # "reply" or "create"
    chat_id: str | None
    parent_id: str | None
    receive_id: str | None
    receive_id_type: str | None
    msg_type: str
    content: str  # the JSON string as sent
    uuid: str | None
    reply_in_thread: bool
    time: float

    @property
    def body(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str | None:
        """The text of a `text` message, else None."""
        body = self.body
        return body.get("text") if self.msg_type == "text" and isinstance(body, dict) else None


@dataclass
class Reaction:
    reaction_id: str
    message_id: str
    emoji_type: str
    time: float
    deleted: bool = False


class FakeFeishu(BackgroundServer):
    """The fake Feishu open API. See the module docstring.

    app_secret: if set, a token request with another secret gets code 10014.
    token_expire: seconds reported to the SDK; at 600 or less the SDK refetches on every call.
    chat_qps: more than this many sends to one chat (or one user) within a second get 230020.
    app_limits: (count, seconds) pairs: more than `count` sends of the app within any `seconds` get the
        gateway limit (HTTP 429, 99991400). Both default to Feishu's documented limits.
    clock: seconds, for the rate windows, the uuid TTL and the times recorded (tests may freeze it).
    """

    def __init__(
        self,
        *,
        bot_open_id: str = "ou_fakebot0000000000000000000000000",
        bot_name: str = "Lucid",
        app_secret: str | None = None,
        token_expire: int = 7200,
        uuid_ttl: float = 3600.0,
        chat_qps: float = CHAT_QPS,
        app_limits: Sequence[tuple[int, float]] = APP_LIMITS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.clock = clock
        self.bot_open_id = bot_open_id
        self.bot_name = bot_name
        self.app_secret = app_secret
        self.token_expire = token_expire
        self.uuid_ttl = uuid_ttl
        self.chat_qps = chat_qps
        self.app_limits = tuple(app_limits)
        self.app_limited = 0  # sends refused by `app_limits`
        self._app_sends: collections.deque[float] = collections.deque()
        self.requests: list[ApiCall] = []
        self.sent: list[SentMessage] = []
        self.reactions: list[Reaction] = []
        self.issued_tokens: list[str] = []
        self._valid_tokens: set[str] = set()
        self._faults: dict[str, collections.deque[Fault]] = {name: collections.deque() for name in ENDPOINTS}
        self._by_uuid: dict[str, SentMessage] = {}
        self._chat_of: dict[str, str] = {}
        self._recalled: set[str] = set()
        self._chat_sends: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self._ids = itertools.count(1)

    # -- test controls ---------------------------------------------------------------------

    def fail(self, endpoint: str, *faults: Fault) -> None:
        """Queue faults for the next requests to `endpoint` (one per request, in order)."""
        if endpoint not in self._faults:
            raise ValueError(f"unknown endpoint {endpoint!r}; one of {ENDPOINTS}")
        with self.lock:
            self._faults[endpoint].extend(faults)

    def expire_tokens(self) -> None:
        """Invalidate every issued token: the next API call with one gets 99991663."""
        with self.lock:
            self._valid_tokens.clear()

    def note_message(self, message_id: str, chat_id: str) -> None:
        """Announce an inbound message: replies and reactions to it are then accepted (and record `chat_id`)."""
        with self.lock:
            self._chat_of[message_id] = chat_id

    def recall(self, message_id: str) -> None:
        """Mark a message as recalled: replying to it then fails with 230011."""
        with self.lock:
            self._recalled.add(message_id)

    @property
    def token_fetches(self) -> int:
        return sum(1 for call in self.requests if call.endpoint == "token")

    def calls(self, endpoint: str) -> list[ApiCall]:
        return [call for call in self.requests if call.endpoint == endpoint]

    def sent_to(self, chat_id: str) -> list[SentMessage]:
        return [m for m in self.sent if m.chat_id == chat_id]

    # -- the app ---------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application()
        routes = [
            ("POST", "/open-apis/auth/v3/tenant_access_token/internal", "token", self._token),
            ("POST", "/open-apis/im/v1/messages/{message_id}/reply", "reply", self._reply),
            ("POST", "/open-apis/im/v1/messages", "create", self._create),
            ("POST", "/open-apis/im/v1/messages/{message_id}/reactions", "reaction_create", self._react),
            (
                "DELETE",
                "/open-apis/im/v1/messages/{message_id}/reactions/{reaction_id}",
                "reaction_delete",
                self._unreact,
            ),
            ("GET", "/open-apis/bot/v3/info", "bot_info", self._bot_info),
        ]
        for method, path, endpoint, handler in routes:
            app.router.add_route(method, path, self._wrap(endpoint, handler))
        return app

    def _wrap(self, endpoint: str, handler: Any) -> Any:
        async def wrapped(request: web.Request) -> web.Response:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = raw.decode(errors="replace")
            call = ApiCall(
                endpoint=endpoint,
                method=request.method,
                path=request.path,
                query=dict(request.query),
                headers=dict(request.headers),
                body=body,
                time=self.clock(),
            )
            with self.lock:
                self.requests.append(call)
                fault = self._faults[endpoint].popleft() if self._faults[endpoint] else None
            await self.lag()
            if fault is not None:
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.status is not None:
                    return fault.response()
            if endpoint != "token":
                denied = self._check_token(request.headers.get("Authorization", ""))
                if denied is not None:
                    return denied
            if request.method == "POST" and not isinstance(body, dict):
                return _fail(FIELD_VALIDATION, "request body must be a JSON object")
            result: web.Response = await handler(request, body)
            return result

        return wrapped

    def _check_token(self, authorization: str) -> web.Response | None:
        if not authorization.startswith("Bearer ") or not authorization[7:]:
            return _fail(TOKEN_MISSING, "Missing access token for authorization.")
        with self.lock:
            valid = authorization[7:] in self._valid_tokens
        if not valid:
            return _fail(TOKEN_INVALID, "Invalid access token for authorization.")
        return None

    async def _token(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        if self.app_secret is not None and body.get("app_secret") != self.app_secret:
            return _fail(APP_SECRET_INVALID, "app secret invalid")
        with self.lock:
            token = f"t-fake{next(self._ids):06d}"
            self.issued_tokens.append(token)
            self._valid_tokens.add(token)
        return web.json_response(
            {"code": 0, "msg": "ok", "tenant_access_token": token, "expire": self.token_expire}
        )

    async def _reply(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        parent_id = request.match_info["message_id"]
        with self.lock:
            recalled = parent_id in self._recalled
            known = parent_id in self._chat_of
            chat_id = self._chat_of.get(parent_id)
        if recalled:
            return _fail(MESSAGE_RECALLED, "The message was withdrawn.")
        if not known:
            return _fail(
                MESSAGE_NOT_FOUND,
                f"The request you send is not a valid {{open_message_id}} or not exists, message_id={parent_id}",
            )
        return self._send(
            body,
            kind="reply",
            chat_id=chat_id,
            parent_id=parent_id,
            receive_id=None,
            receive_id_type=None,
        )

    async def _create(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        receive_id_type = request.query.get("receive_id_type")
        if not receive_id_type:
            return _fail(FIELD_VALIDATION, "field validation failed: receive_id_type is required")
        if receive_id_type not in RECEIVE_ID_TYPES:
            return _field_violation("receive_id_type", f"must be one of {sorted(RECEIVE_ID_TYPES)}")
        receive_id = body.get("receive_id")
        if not receive_id:
            return _fail(FIELD_VALIDATION, "field validation failed: receive_id is required")
        chat_id = receive_id if receive_id_type == "chat_id" else None
        return self._send(
            body,
            kind="create",
            chat_id=chat_id,
            parent_id=None,
            receive_id=receive_id,
            receive_id_type=receive_id_type,
        )

    def _send(
        self,
        body: dict[str, Any],
        *,
        kind: str,
        chat_id: str | None,
        parent_id: str | None,
        receive_id: str | None,
        receive_id_type: str | None,
    ) -> web.Response:
        msg_type, content, uid = body.get("msg_type"), body.get("content"), body.get("uuid")
        if not isinstance(msg_type, str) or not isinstance(content, str):
            return _fail(FIELD_VALIDATION, "field validation failed: msg_type and content are required")
        if uid is not None and (not isinstance(uid, str) or len(uid) > UUID_MAX):
            return _field_violation("uuid", f"the max len is {UUID_MAX}")
        try:
            parsed = json.loads(content)
        except json.JSONDecodeError:
            parsed = None
        problem = content_problem(msg_type, parsed)
        if problem is not None:
            return _fail(INVALID_PARAMS, f"invalid message content: {problem}")
        limit = _TEXT_LIMIT if msg_type == "text" else _RICH_LIMIT
        if len(json.dumps(body, ensure_ascii=False).encode()) > limit:
            return _fail(MESSAGE_TOO_LONG, "The message is too long.")
        now = self.clock()
        with self.lock:
            if uid:
                first = self._by_uuid.get(uid)
                if first is not None and now - first.time < self.uuid_ttl:
                    return _ok(_message_data(first, self.bot_open_id))
            if self.app_limits:
                longest = max(seconds for _, seconds in self.app_limits)
                while self._app_sends and now - self._app_sends[0] >= longest:
                    self._app_sends.popleft()
                for count, seconds in self.app_limits:
                    if sum(1 for t in self._app_sends if now - t < seconds) >= count:
                        self.app_limited += 1
                        return web.json_response(
                            {"code": GATEWAY_RATE_LIMIT, "msg": "request trigger frequency limit"},
                            status=429,
                            headers={"x-ogw-ratelimit-limit": str(count), "x-ogw-ratelimit-reset": "1"},
                        )
                self._app_sends.append(now)
            target = chat_id or (f"{receive_id_type}:{receive_id}" if receive_id else None)
            if target:
                window = self._chat_sends[target]
                while window and now - window[0] >= 1.0:
                    window.popleft()
                if len(window) >= self.chat_qps:
                    return _fail(CHAT_RATE_LIMIT, "This operation triggers the frequency limit.")
                window.append(now)
            message = SentMessage(
                message_id=f"om_fake{next(self._ids):06d}",
                kind=kind,
                chat_id=chat_id,
                parent_id=parent_id,
                receive_id=receive_id,
                receive_id_type=receive_id_type,
                msg_type=msg_type,
                content=content,
                uuid=uid,
                reply_in_thread=bool(body.get("reply_in_thread")),
                time=now,
            )
            self.sent.append(message)
            if uid:
                self._by_uuid[uid] = message
            if chat_id:
                self._chat_of[message.message_id] = chat_id
        return _ok(_message_data(message, self.bot_open_id))

    async def _react(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        emoji = (body.get("reaction_type") or {}).get("emoji_type")
        if not emoji:
            return _fail(FIELD_VALIDATION, "field validation failed: reaction_type.emoji_type is required")
        if emoji not in EMOJI_TYPES:
            return _fail(REACTION_TYPE_INVALID, f"reaction type is invalid: {emoji}")
        with self.lock:
            known = request.match_info["message_id"] in self._chat_of
        if not known:
            return _fail(REACTION_MESSAGE_NOT_FOUND, "The message is not found, maybe not exist or deleted.")
        with self.lock:
            reaction = Reaction(
                reaction_id=f"r_fake{next(self._ids):06d}",
                message_id=request.match_info["message_id"],
                emoji_type=emoji,
                time=self.clock(),
            )
            self.reactions.append(reaction)
        return _ok(self._reaction_data(reaction))

    async def _unreact(self, request: web.Request, body: Any) -> web.Response:
        message_id, reaction_id = request.match_info["message_id"], request.match_info["reaction_id"]
        with self.lock:
            found = next(
                (
                    r
                    for r in self.reactions
                    if r.reaction_id == reaction_id and r.message_id == message_id and not r.deleted
                ),
                None,
            )
            if found is not None:
                found.deleted = True
        if found is None:
            return _fail(INVALID_PARAMS, "reaction not found")
        return _ok(self._reaction_data(found))

    def _reaction_data(self, reaction: Reaction) -> dict[str, Any]:
        return {
            "reaction_id": reaction.reaction_id,
            "operator": {"operator_id": self.bot_open_id, "operator_type": "app"},
            "action_time": str(int(reaction.time * 1000)),
            "reaction_type": {"emoji_type": reaction.emoji_type},
        }

    async def _bot_info(self, request: web.Request, body: Any) -> web.Response:
        # `bot` sits at the top level, not under `data` (research/feishu.md §6).
        bot = {
            "activate_status": 2,
            "app_name": self.bot_name,
            "avatar_url": "",
            "ip_white_list": [],
            "open_id": self.bot_open_id,
        }
        return web.json_response({"code": 0, "msg": "ok", "bot": bot})


def content_problem(msg_type: str, content: Any) -> str | None:
    """Why `content` (parsed JSON) is not a valid `msg_type` message as Feishu's send API takes it, or None."""
    if not isinstance(content, dict):
        return "content must be a JSON object"
    if msg_type == "text":
        return None if isinstance(content.get("text"), str) else 'text content is {"text": "..."}'
    if msg_type == "post":
        return _post_problem(content)
    if msg_type == "interactive":
        elements = content.get("elements")
        if isinstance(elements, list) or content.get("i18n_elements") or content.get("card_link"):
            return None
        if content.get("schema") == "2.0" and isinstance(content.get("body"), dict):
            return None
        data = content.get("data")
        if (
            content.get("type") in ("template", "card")
            and isinstance(data, dict)
            and (data.get("template_id") or data.get("card_id"))
        ):
            return None
        return "a card has elements, a 2.0 body, or a template/card id"
    fields = _KEYED_CONTENT.get(msg_type)
    if fields is None:
        return f"unknown msg_type {msg_type!r}"
    missing = [f for f in fields if not isinstance(content.get(f), str) or not content[f]]
    return f"{msg_type} content needs {missing}" if missing else None


def _post_problem(post: dict[str, Any]) -> str | None:
    """The send form of a post: {"zh_cn": {"title": str, "content": [[node, ...], ...]}, ...}."""
    if not post:
        return "a post needs at least one locale"
    for locale, doc in post.items():
        if not isinstance(locale, str) or len(locale) != 5 or locale[2] != "_" or not locale.islower():
            return f"{locale!r} is not a locale such as zh_cn or en_us"
        if not isinstance(doc, dict):
            return f"{locale}: a post body is an object with title and content"
        title, paragraphs = doc.get("title", ""), doc.get("content", [])
        if not isinstance(title, str) or not isinstance(paragraphs, list):
            return f"{locale}: title is a string and content a list of paragraphs"
        if not title and not paragraphs:
            return f"{locale}: an empty post"
        for paragraph in paragraphs:
            if not isinstance(paragraph, list):
                return f"{locale}: each paragraph is a list of nodes"
            for node in paragraph:
                tag = node.get("tag") if isinstance(node, dict) else None
                if tag not in _POST_TAGS:
                    return f"{locale}: unknown post node {node!r}"
                missing = [f for f in _POST_TAGS[tag] if not isinstance(node.get(f), str)]
                if missing:
                    return f"{locale}: a {tag} node needs {missing}"
                if tag == "md" and len(paragraph) > 1:
                    return f"{locale}: an md node must be alone in its paragraph"
    return None


def _field_violation(field_name: str, description: str) -> web.Response:
    """Feishu's field-validation error, with the `field_violations` detail it sends."""
    body = {
        "code": FIELD_VALIDATION,
        "msg": f"field validation failed: {field_name} {description}",
        "error": {"field_violations": [{"field": field_name, "description": description}]},
    }
    return web.json_response(body, status=400)


def _ok(data: dict[str, Any]) -> web.Response:
    return web.json_response({"code": 0, "msg": "success", "data": data})


def _fail(code: int, msg: str, status: int = 400) -> web.Response:
    return web.json_response({"code": code, "msg": msg}, status=status)


def _message_data(message: SentMessage, bot_open_id: str) -> dict[str, Any]:
    ms = str(int(message.time * 1000))
    return {
        "message_id": message.message_id,
        "root_id": message.parent_id or "",
        "parent_id": message.parent_id or "",
        "msg_type": message.msg_type,
        "create_time": ms,
        "update_time": ms,
        "deleted": False,
        "updated": False,
        "chat_id": message.chat_id or "",
        "sender": {"id": bot_open_id, "id_type": "open_id", "sender_type": "app", "tenant_key": ""},
        "body": {"content": message.content},
        "mentions": [],
    }


def make_client(
    fake: FakeFeishu, app_id: str | None = None, app_secret: str = "fake-secret", timeout: float = 5.0
) -> lark.Client:
    """A real `lark.Client` whose every request goes to `fake`.

    The SDK caches tenant tokens process-wide, keyed by app_id, so by default each client gets a
    fresh app_id: a cached token from another fake (or test) never leaks in and `fake.token_fetches`
    counts exactly what this client fetched.
    """
    return (
        lark.Client.builder()
        .app_id(app_id or f"cli_test{uuidlib.uuid4().hex[:12]}")
        .app_secret(app_secret)
        .domain(fake.url)
        .timeout(timeout)
        .build()
    )


def forget_token(app_id: str) -> None:
    """Drop the SDK's cached tenant token for `app_id` (the SDK never does this on 99991663)."""
    TokenManager.cache.set(f"self_tenant_token:{app_id}", "", 0)
