"""The Ollama adapter (`LLM`): the `ollama` client with timeouts, bounded retries, and errors translated here."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from memory_core.reasoning import strip_partial, strip_reasoning

from .errors import LLMBadOutput, LLMError, LLMUnavailable

# The ollama client (pydantic, httpx) is ~40 % of `lucid`'s start-up: paid at the first model call.
if TYPE_CHECKING:
    import ollama

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ChatResult:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""


@dataclass
class Usage:
    """Calls and tokens spent, for budgets and metrics."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: int = 0
    by_model: dict[str, int] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _options(temperature: float | None, max_chars: int | None) -> dict[str, Any] | None:
    """Ollama's options: a temperature, and `num_predict` so a model asked for `max_chars` stops near them
    (a token is a character or more of text)."""
    options: dict[str, Any] = {}
    if temperature is not None:
        options["temperature"] = temperature
    if max_chars is not None:
        options["num_predict"] = max_chars
    return options or None


class LLM:
    """The chat and embedding calls Lucid makes. Callers see `LLMUnavailable` (server down, timeout, 5xx after retries), `LLMError` (the server refused:
    unknown model, bad request) and plain results; no `ollama` or `httpx` exception leaks past this module."""

    def __init__(
        self, host: str | None, timeout: float = 60.0, retries: int = 1, backoff: float = 0.5
    ) -> None:
        self.host = host
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.usage = Usage()
        self._clients: dict[float, ollama.Client] = {}
        # Told of every call: (what, model, ok, prompt tokens, completion tokens); wired to metrics.
        self.on_call: Callable[[str, str, bool, int, int], None] | None = None

    def _report(self, what: str, model: str, ok: bool, prompt: int = 0, completion: int = 0) -> None:
        if self.on_call is not None:
            try:
                self.on_call(what, model, ok, prompt, completion)
            except Exception:  # metrics must never break a model call
                log.debug("on_call hook failed", exc_info=True)

    def close(self) -> None:
        """Close the HTTP connections of the clients made so far."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()  # type: ignore[no-untyped-call]

    def _client(self, timeout: float) -> ollama.Client:
        client = self._clients.get(timeout)
        if client is None:
            import ollama

            client = ollama.Client(host=self.host, timeout=timeout)
            self._clients[timeout] = client
        return client

    def _call(self, what: str, timeout: float | None, fn: Any) -> Any:
        """`timeout` bounds the whole call, retries included, so a retry never answers after the turn's model
        budget is spent."""
        import httpx
        import ollama

        attempts = self.retries + 1
        budget = timeout or self.timeout
        deadline = time.monotonic() + budget
        last: Exception | None = None
        bad_output = False
        for attempt in range(attempts):
            left = deadline - time.monotonic()
            if attempt and left < 1.0:
                break
            try:
                # whole seconds after the first try: one cached client per distinct timeout
                return fn(self._client(budget if attempt == 0 else float(math.ceil(left))))
            except ollama.ResponseError as exc:
                if exc.status_code is not None and exc.status_code < 500:
                    self.usage.failures += 1
                    raise LLMError(f"{what}: {exc.error} (HTTP {exc.status_code})") from exc
                last = exc
            except (httpx.HTTPError, ConnectionError, OSError) as exc:
                last = exc
            except ValueError as exc:  # a body or a tool call the client cannot parse: the server is up
                last = exc
                bad_output = True
            if attempt + 1 < attempts:
                time.sleep(self.backoff * (2**attempt))
        self.usage.failures += 1
        if bad_output and isinstance(last, ValueError):
            raise LLMBadOutput(
                f"{what}: unreadable answer ({type(last).__name__}: {str(last)[:120]})"
            ) from last
        raise LLMUnavailable(
            f"{what}: model server unavailable ({type(last).__name__}: {str(last)[:120]})"
        ) from last

    def _account(self, result: ChatResult) -> ChatResult:
        self.usage.calls += 1
        self.usage.prompt_tokens += result.prompt_tokens
        self.usage.completion_tokens += result.completion_tokens
        self.usage.by_model[result.model] = self.usage.by_model.get(result.model, 0) + 1
        self._report("chat", result.model, True, result.prompt_tokens, result.completion_tokens)
        return result

    def chat(
        self,
        model: str,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        format: str | dict[str, Any] | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
        max_chars: int | None = None,
    ) -> ChatResult:
        """One answer; `max_chars`: at most that much text is kept (and asked for: `num_predict`)."""
        options = _options(temperature, max_chars)

        def run(client: ollama.Client) -> Any:
            return client.chat(
                model=model,
                messages=list(messages),
                tools=list(tools) if tools else None,
                format=cast(Any, format),
                options=options,
                stream=False,
            )

        try:
            resp = self._call(f"chat with {model}", timeout, run)
        except LLMError:
            self._report("chat", model, False)
            raise
        msg = resp.message
        calls = []
        for tc in msg.tool_calls or ():
            args = tc.function.arguments
            calls.append(ToolCall(tc.function.name, dict(args) if isinstance(args, dict) else {}))
        result = ChatResult(
            content=strip_reasoning(msg.content or "")[:max_chars],  # `msg.thinking` is never read
            tool_calls=tuple(calls),
            prompt_tokens=int(resp.prompt_eval_count or 0),
            completion_tokens=int(resp.eval_count or 0),
            model=model,
        )
        return self._account(result)

    def chat_stream(
        self,
        model: str,
        messages: Sequence[dict[str, Any]],
        on_text: Callable[[str], None],
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        timeout: float | None = None,
        max_chars: int | None = None,
    ) -> ChatResult:
        """`chat`, streamed: `on_text` gets the whole text so far after each chunk. A failure before the first
        chunk is retried; one mid-stream is not (the person saw part), and it must end within `timeout`.
        With `max_chars`, the stream is left once that much text has come."""
        budget = timeout or self.timeout
        deadline = time.monotonic() + budget

        def run(client: ollama.Client) -> ChatResult:
            parts: list[str] = []
            calls: list[ToolCall] = []
            prompt = completion = 0
            shown = ""
            for chunk in client.chat(
                model=model,
                messages=list(messages),
                tools=list(tools) if tools else None,
                options=_options(None, max_chars),
                stream=True,
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError("the model's stream outran the turn's budget")
                msg = chunk.message
                if msg.content:  # `msg.thinking` chunks are never shown
                    parts.append(msg.content)
                    now = strip_partial("".join(parts))  # no scratchpad, not even a tag arriving
                    if now and now != shown:
                        shown = now
                        try:
                            on_text(now)
                        except Exception:  # showing progress must never cost the answer
                            log.warning("streaming hook failed", exc_info=True)
                for tc in msg.tool_calls or ():
                    args = tc.function.arguments
                    calls.append(ToolCall(tc.function.name, dict(args) if isinstance(args, dict) else {}))
                if chunk.done:
                    prompt, completion = int(chunk.prompt_eval_count or 0), int(chunk.eval_count or 0)
                if max_chars is not None and len(shown) >= max_chars:
                    break  # a model that does not stop: what came is the answer
            text = strip_reasoning("".join(parts))[:max_chars]
            return ChatResult(text, tuple(calls), prompt, completion, model)

        try:
            result: ChatResult = self._call(f"chat with {model}", budget, run)
        except LLMError:
            self._report("chat", model, False)
            raise
        return self._account(result)

    def embed(self, model: str, texts: Sequence[str], timeout: float | None = None) -> list[list[float]]:
        try:
            resp = self._call(
                f"embed with {model}", timeout, lambda c: c.embed(model=model, input=list(texts))
            )
        except LLMError:
            self._report("embed", model, False)
            raise
        self._report("embed", model, True, int(getattr(resp, "prompt_eval_count", 0) or 0))
        return [list(map(float, v)) for v in resp.embeddings]

    def models(self, timeout: float = 5.0) -> list[str]:
        resp = self._call("list models", timeout, lambda c: c.list())
        return [m.model for m in resp.models if m.model]
