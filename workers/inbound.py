"""The values a turn works on: an inbound message (JSON-safe, from the webhook or `lucid chat`), its
mentions, the turn's limits and its result."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from memory_core.namespace import Namespace
from memory_core.ops import Outcome


@dataclass(frozen=True)
class Mention:
    """Someone else @mentioned in the message (never the bot itself)."""

    name: str
    open_id: str
    union_id: str = ""

    @property
    def user(self) -> str:
        return self.union_id or self.open_id


@dataclass(frozen=True)
class Inbound:
    """One message for the bot, as routing made it: JSON-safe, so it can ride an RQ job."""

    tenant: str
    user: str  # union_id when present (stable across a developer's apps), else open_id
    open_id: str
    persona: str
    chat_id: str
    chat_type: str  # "p2p" or "group"
    message_id: str
    text: str  # @_user_N placeholders resolved, the bot's own mention removed
    mentioned_bot: bool = False
    create_time: int = 0  # milliseconds since the epoch, as Feishu sends it
    event_id: str = ""
    mentions: tuple[Mention, ...] = ()
    kind: str = "text"  # "text" (text and rich text); else a type the bot cannot read: image, file, audio…
    thread_id: str = ""  # the topic thread the message is in: the reply goes there, one session per thread
    lang: str = ""  # the conversation's language ("zh"/"en") when the message itself shows none (/memory)
    cut_from: int = 0  # the text's length as sent, when routing cut it to what a turn reads (else 0)

    @property
    def ns(self) -> Namespace:
        return Namespace.of(self.tenant, self.user, self.persona)

    @property
    def conversation(self) -> str:
        """The chat, or the thread in it: what a session and its recent turns belong to."""
        return f"{self.chat_id}:{self.thread_id}" if self.thread_id else self.chat_id

    @property
    def group(self) -> bool:
        return self.chat_type != "p2p"

    @property
    def scope(self) -> str:
        """Where what is learned from this message may be shown again (DESIGN §3 `scope`)."""
        return f"g:{self.chat_id}" if self.group else "p2p"

    def created(self, fallback: datetime) -> datetime:
        if self.create_time <= 0:
            return fallback
        return datetime.fromtimestamp(self.create_time / 1000, UTC).replace(microsecond=0)

    def to_json(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies and costs more than the rest of the webhook's work.
        data = {name: getattr(self, name) for name in _INBOUND_FIELDS}
        data["mentions"] = [
            {"name": m.name, "open_id": m.open_id, "union_id": m.union_id} for m in self.mentions
        ]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Inbound:
        mentions = tuple(Mention(**m) for m in data.get("mentions") or ())
        names = set(cls.__dataclass_fields__) - {"mentions"}
        return cls(**{k: v for k, v in data.items() if k in names}, mentions=mentions)


_INBOUND_FIELDS = tuple(name for name in Inbound.__dataclass_fields__ if name != "mentions")


@dataclass
class TurnResult:
    """What a turn did, for logs, the CLI and tests (never persisted)."""

    reply: str = ""
    mode: str = ""  # command, model, memory (no model or model down), error
    delivered: bool = False
    outcomes: list[Outcome] = field(default_factory=list)
    recalled: list[str] = field(default_factory=list)
    used: list[str] = field(default_factory=list)  # the shown entries the reply used: these get a hit
    tool_calls: int = 0
    ms: float = 0.0
    card: dict[str, Any] | None = None  # an interactive card sent instead of `reply` where cards exist


@dataclass(frozen=True)
class TurnLimits:
    """Budgets of one turn: the model gets `model_budget` seconds in all; then, or when it is down, the turn
    answers from memory and skips the model for `model_cooldown` (a dead Ollama costs one timeout)."""

    model_budget: float = 45.0
    tool_rounds: int = 3
    history_turns: int = 6
    model_cooldown: float = 30.0
