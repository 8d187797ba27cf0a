"""A local fake of the Ollama HTTP API, for tests that drive the real `ollama` client.

The fake runs in a background thread with its own event loop, so sync tests and async tests
(on any loop) use it the same way:

    with FakeOllama() as fake:
        fake.script("你好！", {"tool_calls": [{"function": {"name": "manage_memory", "arguments": {...}}}]})
        client = ollama.Client(host=fake.url)            # or ollama.AsyncClient(host=fake.url)
        client.chat(model="qwen3", messages=[...])       # -> "你好！"
        assert fake.chat_requests[0]["messages"][-1]["content"] == "..."

`/api/chat` answers, in order: the next scripted reply; else `fake.responder(request_json)` if set;
else the `default_reply` given at construction; else HTTP 500 (a test that forgot to script a reply
fails loudly instead of getting a plausible answer). A reply is

- a `str`: the assistant message content;
- a `dict`: the assistant message itself, e.g. `{"content": "", "tool_calls": [...]}`;
- a marker: `HttpError(status, error)`, `ModelNotFound()` (404, which the client raises as
  `ollama.ResponseError`), `Garbage(text)` (a 200 whose content is not what was asked for),
  `BrokenBody()` (a 200 whose body is not JSON), or `Delay(seconds, then)`.

The fake refuses what Ollama refuses (docs/api.md of ollama/ollama; each rule has a conformance test in
tests/test_fakes.py): a model that is not pulled gets 404 `model "x" not found, try pulling it first`
("qwen3" means "qwen3:latest", not "qwen3:4b"); a chat with an embedding-only model, `tools` to a model
without tool support or `think` to one without thinking gets 400; a malformed `tools` list, a `format`
that is neither "json" nor a JSON schema object, and `options` of the wrong type get 400 (an option name
Ollama does not know is ignored there with a warning; the fake refuses it, so a typo cannot pass).

Reasoning models (qwen3, deepseek-r1, qwq, gpt-oss, magistral) answer as qwen3 does: with `think` unset
the content starts with a `<think>…</think>` scratchpad (`SCRATCHPAD`); with `think: true` the
scratchpad comes in `message.thinking` and the content is clean; `think: false` gives no scratchpad.
`reasoning=False` turns this off; a scripted dict reply may carry its own `thinking`.

`/api/embed` returns deterministic hashed char-bigram vectors (`embed_text`), so similar strings,
Chinese or English, come out similar without any model. `/api/tags` lists `models`, `/api/show` a
model's capabilities, `/api/generate` answers a prompt like `/api/chat`; `/api/version`
answers a version string. `down()`/`up()` stop and restart the listener on the same port (the client
then raises `ConnectionError`); `slow(seconds)` delays every request.

`BackgroundServer` is the thread-and-loop runner shared with `tests.fakes.feishu`.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import math
import re
import socket
import threading
import time
import unicodedata
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

from aiohttp import web

from memory_core.policy import HAN

__all__ = [
    "SCRATCHPAD",
    "BackgroundServer",
    "BrokenBody",
    "Delay",
    "FakeOllama",
    "Garbage",
    "HttpError",
    "ModelNotFound",
    "Reply",
    "capabilities",
    "embed_text",
]


class BackgroundServer:
    """Serve an aiohttp app on 127.0.0.1:<free port> from a daemon thread with its own event loop.

    Subclasses implement `build_app()`. Use as a context manager or call `start()`/`stop()`;
    `url` is "http://127.0.0.1:PORT" once started. `down()` closes the listener and every open
    connection (clients see "connection refused"); `up()` listens again on the same port.
    Request handlers run on the server thread, so state they share with tests sits behind `lock`.
    """

    shutdown_timeout = 0.2  # in-flight requests (e.g. a scripted delay) are cancelled after this

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.url = ""
        self._port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._delay = 0.0

    def build_app(self) -> web.Application:
        raise NotImplementedError

    def start(self) -> Self:
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=f"{type(self).__name__}-loop", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._call(self._listen())
        except BaseException:
            self.stop()
            raise
        self.url = f"http://127.0.0.1:{self._port}"
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            self._call(self._close())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()
            self._loop = self._thread = None

    def down(self) -> None:
        """Stop listening and drop open connections; the port stays reserved for `up()`."""
        self._call(self._close())

    def up(self) -> None:
        """Listen again on the same port after `down()`."""
        if self._runner is None:
            self._call(self._listen())

    @property
    def is_up(self) -> bool:
        return self._runner is not None

    def slow(self, seconds: float) -> None:
        """Delay every request by `seconds` before handling it; `slow(0)` restores full speed."""
        self._delay = seconds

    async def lag(self) -> None:
        """Handlers await this first, so `slow()` applies to every endpoint."""
        if self._delay > 0:
            await asyncio.sleep(self._delay)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None, "server not started"
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self._port))
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        runner = web.AppRunner(self.build_app(), access_log=None, shutdown_timeout=self.shutdown_timeout)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner

    async def _close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


@dataclass(frozen=True)
class HttpError:
    """Answer with HTTP `status` and `{"error": error}`; the client raises `ollama.ResponseError`."""

    status: int = 500
    error: str = "llama runner process has terminated"


@dataclass(frozen=True)
class ModelNotFound:
    """Answer 404 `model "<requested>" not found`, as Ollama does for a model that is not pulled."""


@dataclass(frozen=True)
class Garbage:
    """A successful reply whose content is not what the caller asked for (e.g. broken JSON)."""

    text: str = '{"action": "add", "text": "记住我喜欢\x00 <|im_end|>'


@dataclass(frozen=True)
class BrokenBody:
    """HTTP 200 with a body that is not JSON; the client fails while decoding it."""

    body: str = "<html><body>502 Bad Gateway</body></html>"


@dataclass(frozen=True)
class Delay:
    """Wait `seconds`, then answer `then` (a client timeout shorter than `seconds` fires first)."""

    seconds: float
    then: Reply = ""


@dataclass(frozen=True)
class Paced:
    """Stream `then` at `tokens_per_second` (one chunk per token; a model writing in real time)."""

    then: str | dict[str, Any]
    tokens_per_second: float = 20.0


@dataclass(frozen=True)
class Endless:
    """A model that never stops: `text` streamed again and again, as fast as the client reads, until the
    client leaves (`streams_left`) or `ENDLESS_BOUND` bytes were sent (then an error: nothing cut it)."""

    text: str


#: Bytes an `Endless` stream sends at most: far more than loopback socket buffers hold, so a client that
#: stops reading is seen leaving (a write fails) instead of the stream fitting in the buffers.
ENDLESS_BOUND = 256 * 1024 * 1024


Reply = str | dict[str, Any] | HttpError | ModelNotFound | Garbage | BrokenBody | Delay | Paced | Endless
Responder = Callable[[dict[str, Any]], Reply]

SCRATCHPAD = "Okay, the user wants an answer. Let me think step by step before I reply."
_THINKING_FAMILIES = ("qwen3", "deepseek-r1", "qwq", "gpt-oss", "magistral")
_EMBED_FAMILIES = ("nomic-embed", "mxbai-embed", "bge-", "all-minilm", "snowflake-arctic-embed", "embed")
_NO_TOOLS_FAMILIES = ("gemma", "llava", "phi3")
_THINK_LEVELS = ("low", "medium", "high")
# Ollama's runner options (api/types.go `Options` + `Runner`): name -> accepted JSON types.
_NUM = (int, float)
_OPTIONS: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(
        (
            "num_keep",
            "seed",
            "num_predict",
            "top_k",
            "num_ctx",
            "num_batch",
            "num_gpu",
            "main_gpu",
            "num_thread",
            "repeat_last_n",
            "mirostat",
        ),
        (int,),
    ),
    **dict.fromkeys(
        (
            "top_p",
            "min_p",
            "typical_p",
            "repeat_penalty",
            "temperature",
            "presence_penalty",
            "frequency_penalty",
            "tfs_z",
            "mirostat_tau",
            "mirostat_eta",
        ),
        _NUM,
    ),
    **dict.fromkeys(
        (
            "penalize_newline",
            "numa",
            "use_mmap",
            "use_mlock",
            "low_vram",
            "f16_kv",
            "vocab_only",
            "logits_all",
        ),
        (bool,),
    ),
    "stop": (list,),
}


def capabilities(model: str) -> list[str]:
    """What `/api/show` lists for `model`, from its family name (Ollama reads it from the model file)."""
    base = model.split("/")[-1].lower()
    if any(base.startswith(f) or f in base for f in _EMBED_FAMILIES):
        return ["embedding"]
    caps = ["completion"]
    if not base.startswith(_NO_TOOLS_FAMILIES):
        caps.append("tools")
    if base.startswith(_THINKING_FAMILIES):
        caps.append("thinking")
    return caps


_TOKEN = re.compile(rf"[{HAN}]|[^\W_]+|[^\w\s]", re.UNICODE)
_STREAM_CHUNK_CHARS = 6
_TOKEN_OR_SPACE = re.compile(rf"\s*(?:[{HAN}]|[^\W_]+|[^\w\s])", re.UNICODE)


def count_tokens(text: str) -> int:
    """A crude token count: one per CJK character, word or punctuation mark."""
    return len(_TOKEN.findall(text))


def embed_text(text: str, dim: int = 64) -> list[float]:
    """Deterministic unit vector from hashed character bigrams (signed feature hashing).

    Strings sharing many bigrams ("我喜欢喝咖啡" / "我很喜欢喝咖啡", "coffee" / "coffees") get a high
    cosine; unrelated strings land near 0. Tests may call this to compute expected similarities.
    """
    norm = " ".join(unicodedata.normalize("NFKC", text).lower().split())
    grams = [norm[i : i + 2] for i in range(len(norm) - 1)] or [norm]
    vec = [0.0] * dim
    for gram in grams:
        h = int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=8).digest(), "big")
        vec[h % dim] += 1.0 if (h >> 32) & 1 else -1.0
    length = math.sqrt(sum(v * v for v in vec))
    if length == 0:  # the empty string, or grams that cancelled out: still return a unit vector
        vec[0], length = 1.0, 1.0
    return [v / length for v in vec]


class FakeOllama(BackgroundServer):
    """The fake Ollama server. See the module docstring for how tests script it.

    models: the pulled models, listed by `/api/tags`. A request for any other model gets 404, as an
    un-pulled model does.
    responder: computes a reply from the request JSON when the script is empty.
    default_reply: the reply when neither script nor responder gives one (None: HTTP 500).
    reasoning: reasoning models answer with a scratchpad, as qwen3 does (see the module docstring).
    """

    def __init__(
        self,
        *,
        models: Sequence[str] = ("qwen3:4b", "nomic-embed-text"),
        responder: Responder | None = None,
        default_reply: Reply | None = None,
        embed_dim: int = 64,
        version: str = "0.9.0",
        reasoning: bool = True,
    ) -> None:
        super().__init__()
        self.models = list(models)
        self.responder = responder
        self.default_reply = default_reply
        self.embed_dim = embed_dim
        self.version = version
        self.reasoning = reasoning
        self.refused: list[str] = []  # why the fake refused a request as Ollama would (4xx)
        self.chat_requests: list[dict[str, Any]] = []
        self.streamed_at: list[float] = []  # when each streamed answer finished (epoch seconds)
        self.streams_left = 0  # streamed answers the client stopped reading before their end
        self.embed_requests: list[dict[str, Any]] = []
        self.on_embed: Callable[[dict[str, Any]], None] | None = None  # runs on each embed request, first
        self.errors: list[str] = []  # why the fake answered 5xx on its own (e.g. nothing scripted)
        self._script: collections.deque[Reply] = collections.deque()
        self._embed_faults: collections.deque[Reply] = collections.deque()

    # -- scripting -------------------------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Queue replies for the next `/api/chat` calls, in order."""
        with self.lock:
            self._script.extend(replies)

    def fail_embed(self, *faults: Reply) -> None:
        """Queue markers (HttpError, ModelNotFound, BrokenBody, Delay) for the next embed calls."""
        with self.lock:
            self._embed_faults.extend(faults)

    @property
    def pending(self) -> int:
        """Scripted chat replies not yet consumed."""
        with self.lock:
            return len(self._script)

    @property
    def last_chat(self) -> dict[str, Any]:
        return self.chat_requests[-1]

    def reset(self) -> None:
        """Forget the script, recorded requests and errors (the server keeps running)."""
        with self.lock:
            self._script.clear()
            self._embed_faults.clear()
            self.chat_requests.clear()
            self.embed_requests.clear()
            self.errors.clear()

    # -- the app ---------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/chat", self._chat)
        app.router.add_post("/api/generate", self._generate)
        app.router.add_post("/api/show", self._show)
        app.router.add_post("/api/embed", self._embed)
        app.router.add_post("/api/embeddings", self._embeddings)
        app.router.add_get("/api/tags", self._tags)
        app.router.add_get("/api/version", self._version)
        app.router.add_get("/", self._root)
        return app

    def _resolve(self, model: str) -> str | None:
        """The pulled model `model` names ("qwen3" is "qwen3:latest"), or None."""
        name = model if ":" in model.split("/")[-1] else model + ":latest"
        return next((m for m in self.models if m in (model, name)), None)

    def _refuse(self, status: int, why: str) -> web.Response:
        self.refused.append(why)
        return _error(status, why)

    def _check(self, body: dict[str, Any], *, chat: bool) -> web.Response | None:
        """Ollama's checks on a chat/generate request, in its order: shape, model, capabilities, fields."""
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return self._refuse(400, "model is required")
        if self._resolve(model) is None:
            return self._refuse(404, f'model "{model}" not found, try pulling it first')
        caps = capabilities(model)
        if "completion" not in caps:
            return self._refuse(400, f'"{model}" does not support {"chat" if chat else "generate"}')
        if chat:
            problem = _check_messages(body.get("messages"))
            if problem:
                return self._refuse(400, problem)
        tools = body.get("tools")
        if tools:
            if "tools" not in caps:
                return self._refuse(400, f"registry.ollama.ai/library/{model} does not support tools")
            problem = _check_tools(tools)
            if problem:
                return self._refuse(400, problem)
        think = body.get("think")
        if think is not None:
            if not isinstance(think, bool) and think not in _THINK_LEVELS:
                return self._refuse(400, f"invalid think value: {think!r} (true, false or low/medium/high)")
            if think and "thinking" not in caps:
                return self._refuse(400, f'"{model}" does not support thinking')
        problem = _check_format(body.get("format")) or _check_options(body.get("options"))
        if problem:
            return self._refuse(400, problem)
        return None

    def _think(self, body: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        """Add the scratchpad a reasoning model writes (see the module docstring)."""
        model = str(body.get("model", ""))
        if not self.reasoning or "thinking" not in capabilities(model) or "thinking" in message:
            return message
        think = body.get("think")
        if think is None:
            if "<think>" not in message["content"]:
                message["content"] = f"<think>\n{SCRATCHPAD}\n</think>\n\n" + message["content"]
        elif think:
            message["thinking"] = SCRATCHPAD
        return message

    async def _answer(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await _read_json(request)
        if body is None:
            return _error(400, "invalid JSON body")
        with self.lock:  # take the reply on arrival, so replies match requests in arrival order
            self.chat_requests.append(body)
            refused = self._check(body, chat=chat)
            reply = None if refused is not None else (self._script.popleft() if self._script else None)
        if refused is not None:
            return refused
        await self.lag()
        if reply is None and self.responder is not None:
            reply = self.responder(body)
        if reply is None:
            reply = self.default_reply
        if reply is None:
            why = f"FakeOllama: no scripted reply for chat request #{len(self.chat_requests)}"
            self.errors.append(why)
            return _error(500, why)
        model = str(body.get("model", ""))
        while isinstance(reply, Delay):
            await asyncio.sleep(reply.seconds)
            reply = reply.then
        if isinstance(reply, HttpError):
            return _error(reply.status, reply.error)
        if isinstance(reply, ModelNotFound):
            return _error(404, f'model "{model}" not found, try pulling it first')
        if isinstance(reply, BrokenBody):
            return web.Response(status=200, text=reply.body, content_type="application/json")
        if isinstance(reply, Garbage):
            reply = reply.text
        pace, endless = 0.0, ""
        if isinstance(reply, Paced):
            pace, reply = 1.0 / reply.tokens_per_second, reply.then
        if isinstance(reply, Endless):
            endless = reply = reply.text
        message: dict[str, Any] = (
            {"role": "assistant", "content": reply} if isinstance(reply, str) else dict(reply)
        )
        message.setdefault("role", "assistant")
        message.setdefault("content", "")
        message = self._think(body, message)
        stats = self._stats(body, message)
        if not chat:
            return await self._generated(request, body, message, stats)
        if body.get("stream", True):
            return await self._stream(request, model, message, stats, pace, endless)
        return web.json_response({"model": model, "created_at": _now(), "message": message, **stats})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, chat=True)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        """`/api/generate`: the same model, the answer in `response` (and `thinking`)."""
        return await self._answer(request, chat=False)

    async def _generated(
        self, request: web.Request, body: dict[str, Any], message: dict[str, Any], stats: dict[str, Any]
    ) -> web.StreamResponse:
        model = str(body.get("model", ""))
        extra = {"thinking": message["thinking"]} if message.get("thinking") else {}
        if not body.get("stream", True):
            answer = {"model": model, "created_at": _now(), "response": message["content"], **extra, **stats}
            return web.json_response(answer)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        content: str = message["content"]
        lines = [{"response": "", **extra, "done": False}] if extra else []
        lines += [
            {"response": content[i : i + _STREAM_CHUNK_CHARS], "done": False}
            for i in range(0, len(content), _STREAM_CHUNK_CHARS)
        ]
        lines.append({"response": "", **stats})
        for line in lines:
            line = {"model": model, "created_at": _now(), **line}
            await resp.write(json.dumps(line, ensure_ascii=False).encode() + b"\n")
        await resp.write_eof()
        return resp

    async def _show(self, request: web.Request) -> web.Response:
        await self.lag()
        body = await _read_json(request)
        model = str((body or {}).get("model") or (body or {}).get("name") or "")
        if not model or self._resolve(model) is None:
            return self._refuse(404, f'model "{model}" not found')
        family = model.split(":")[0].split("/")[-1]
        return web.json_response(
            {
                "modelfile": f"FROM {model}",
                "parameters": "",
                "template": "{{ .Prompt }}",
                "details": {"format": "gguf", "family": family, "parameter_size": "1B"},
                "model_info": {"general.architecture": family},
                "capabilities": capabilities(model),
                "modified_at": "2025-01-01T00:00:00Z",
            }
        )

    async def _stream(
        self,
        request: web.Request,
        model: str,
        message: dict[str, Any],
        stats: dict[str, Any],
        pace: float = 0.0,
        endless: str = "",
    ) -> web.StreamResponse:
        """NDJSON: thinking then content in small chunks, then (`endless`) that text again until the client
        leaves, then any other message fields, then a done chunk."""
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)

        async def send(part: dict[str, Any]) -> None:
            line = {"model": model, "created_at": _now(), **part}
            await resp.write(json.dumps(line, ensure_ascii=False).encode() + b"\n")

        thinking = str(message.get("thinking") or "")
        for i in range(0, len(thinking), _STREAM_CHUNK_CHARS):
            chunk = thinking[i : i + _STREAM_CHUNK_CHARS]
            await send(
                {"message": {"role": message["role"], "content": "", "thinking": chunk}, "done": False}
            )
        content: str = message["content"]
        chunks = (
            _TOKEN_OR_SPACE.findall(content)
            if pace
            else [content[i : i + _STREAM_CHUNK_CHARS] for i in range(0, len(content), _STREAM_CHUNK_CHARS)]
        )
        try:
            for chunk in chunks:
                if pace:
                    await asyncio.sleep(pace)
                await send({"message": {"role": message["role"], "content": chunk}, "done": False})
            sent = 0
            while endless and sent < ENDLESS_BOUND:
                await send({"message": {"role": message["role"], "content": endless}, "done": False})
                sent += len(endless.encode())
            if endless:
                self.errors.append(f"an endless stream was read to {ENDLESS_BOUND} bytes: nothing cut it")
        except ConnectionResetError:  # the client stopped reading (as Ollama, the generation just ends)
            self.streams_left += 1
            return resp
        self.streamed_at.append(time.time())
        extra = {k: v for k, v in message.items() if k not in ("role", "content", "thinking")}
        if extra:
            await send({"message": {"role": message["role"], "content": "", **extra}, "done": False})
        await send({"message": {"role": message["role"], "content": ""}, **stats})
        await resp.write_eof()
        return resp

    def _stats(self, body: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        prompt = "\n".join(str(m.get("content") or "") for m in body.get("messages") or [])
        if body.get("tools"):
            prompt += json.dumps(body["tools"], ensure_ascii=False)
        output = (
            str(message.get("thinking") or "")
            + message["content"]
            + (json.dumps(message["tool_calls"], ensure_ascii=False) if message.get("tool_calls") else "")
        )
        prompt_tokens, output_tokens = count_tokens(prompt), count_tokens(output)
        return {
            "done": True,
            "done_reason": "stop",
            "total_duration": 1_000_000 * (prompt_tokens + output_tokens + 1),
            "load_duration": 1_000_000,
            "prompt_eval_count": prompt_tokens,
            "prompt_eval_duration": 1_000_000 * prompt_tokens,
            "eval_count": output_tokens,
            "eval_duration": 1_000_000 * output_tokens,
        }

    async def _embed_fault(self, model: str) -> web.Response | None:
        with self.lock:
            fault = self._embed_faults.popleft() if self._embed_faults else None
        if fault is None and self._resolve(model) is None:
            fault = ModelNotFound()
        while isinstance(fault, Delay):
            await asyncio.sleep(fault.seconds)
            fault = fault.then or None
        if isinstance(fault, HttpError):
            return _error(fault.status, fault.error)
        if isinstance(fault, ModelNotFound):
            return _error(404, f'model "{model}" not found, try pulling it first')
        if isinstance(fault, BrokenBody):
            return web.Response(status=200, text=fault.body, content_type="application/json")
        return None

    async def _embed(self, request: web.Request) -> web.Response:
        await self.lag()
        body = await _read_json(request)
        if body is None:
            return _error(400, "invalid JSON body")
        with self.lock:
            self.embed_requests.append(body)
        if self.on_embed is not None:
            self.on_embed(body)  # what happens elsewhere while the client waits (a test's interleaving)
        model = str(body.get("model", ""))
        fault = await self._embed_fault(model)
        if fault is not None:
            return fault
        raw = body.get("input", "")
        if not isinstance(raw, str) and not (isinstance(raw, list) and all(isinstance(t, str) for t in raw)):
            return self._refuse(400, "invalid input type: input is a string or a list of strings")
        problem = _check_options(body.get("options"))
        if problem:
            return self._refuse(400, problem)
        texts = [raw] if isinstance(raw, str) else list(raw)
        dim = int(body.get("dimensions") or self.embed_dim)
        return web.json_response(
            {
                "model": model,
                "embeddings": [embed_text(t, dim) for t in texts],
                "total_duration": 1_000_000 * (len(texts) + 1),
                "load_duration": 1_000_000,
                "prompt_eval_count": sum(count_tokens(t) for t in texts),
            }
        )

    async def _embeddings(self, request: web.Request) -> web.Response:
        """The legacy single-prompt endpoint (`client.embeddings`)."""
        await self.lag()
        body = await _read_json(request)
        if body is None:
            return _error(400, "invalid JSON body")
        with self.lock:
            self.embed_requests.append(body)
        fault = await self._embed_fault(str(body.get("model", "")))
        if fault is not None:
            return fault
        return web.json_response({"embedding": embed_text(str(body.get("prompt", "")), self.embed_dim)})

    async def _tags(self, request: web.Request) -> web.Response:
        await self.lag()
        models = [
            {
                "name": name,
                "model": name,
                "modified_at": "2025-01-01T00:00:00Z",
                "size": 1_000_000,
                "digest": hashlib.sha256(name.encode()).hexdigest(),
                "details": {"format": "gguf", "family": "fake", "parameter_size": "1B"},
            }
            for name in self.models
        ]
        return web.json_response({"models": models})

    async def _version(self, request: web.Request) -> web.Response:
        await self.lag()
        return web.json_response({"version": self.version})

    async def _root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")


def _check_messages(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return "messages must be a list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return f"messages[{i}]: a message needs a role"
        if not isinstance(m.get("content", ""), str):
            return (
                f"json: cannot unmarshal {type(m['content']).__name__} into Go struct field Message.content"
            )
    return None


def _check_tools(tools: Any) -> str | None:
    """The shape Ollama's `api.Tool` unmarshals: {"type": "function", "function": {"name", "parameters"}}."""
    if not isinstance(tools, list):
        return "json: cannot unmarshal tools: expected an array of tools"
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            return f'tools[{i}]: a tool is {{"type": "function", "function": {{...}}}}'
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            return f"tools[{i}]: function.name is required"
        if not isinstance(fn.get("description", ""), str):
            return f"tools[{i}]: function.description must be a string"
        params = fn.get("parameters")
        if params is None:
            continue
        if not isinstance(params, dict) or params.get("type") != "object":
            return f'tools[{i}]: function.parameters must be a JSON schema with "type": "object"'
        props = params.get("properties", {})
        required = params.get("required", [])
        if not isinstance(props, dict) or not isinstance(required, list):
            return f"tools[{i}]: parameters.properties is an object and parameters.required a list"
        missing = [r for r in required if r not in props]
        if missing:
            return f"tools[{i}]: required parameters {missing} are not in properties"
    return None


def _check_format(fmt: Any) -> str | None:
    """`format` is "json" or a JSON schema (an object); "" and null mean none."""
    if fmt in (None, "", "json"):
        return None
    if isinstance(fmt, dict):
        kind = fmt.get("type")
        if kind is not None and kind not in (
            "object",
            "array",
            "string",
            "number",
            "integer",
            "boolean",
            "null",
        ):
            return f"invalid JSON schema in format: unknown type {kind!r}"
        return None
    return f'invalid format: {fmt!r}; expected "json" or a JSON schema'


def _check_options(options: Any) -> str | None:
    if options is None:
        return None
    if not isinstance(options, dict):
        return "json: cannot unmarshal options: expected an object"
    for name, value in options.items():
        kinds = _OPTIONS.get(name)
        if kinds is None:
            return f"invalid option provided: {name!r}"
        if value is None:
            continue
        if isinstance(value, bool) and bool not in kinds:
            return f"invalid type for option {name!r}: {value!r}"
        if not isinstance(value, kinds):
            return f"invalid type for option {name!r}: {value!r}"
        if name == "stop" and not all(isinstance(v, str) for v in value):
            return "option 'stop' must be a list of strings"
    return None


async def _read_json(request: web.Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def _error(status: int, error: str) -> web.Response:
    return web.json_response({"error": error}, status=status)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")
