"""Who may change and who may see a memory: the protection rule and the kinds it and the tiers use."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .entry import Entry

#: Sources a person speaks through; every other source is automatic.
USER_SOURCES = frozenset({"user", "manual"})
#: Types no automatic path may change (besides pinned entries).
PROTECTED_TYPES = frozenset({"rule", "identity", "instruction"})
#: Types that live in the resident tier (in every prompt); `Entry.resident` adds pinned and promoted entries.
RESIDENT_TYPES = frozenset({"rule", "identity", "instruction", "preference"})
#: Types of a private entry a group may see: standing rules and instructions on how to answer (`visible_in`).
GROUP_STANDING_TYPES = frozenset({"rule", "instruction"})

#: What an automatic path is told when it reaches for a protected entry; the model relays it to the user.
REFUSAL = (
    "This memory is protected (pinned, a rule, an identity or a standing instruction): only the person can "
    "change or delete it themselves, with /forget, /unpin or by editing MEMORY.md. Tell them so; it was left "
    "unchanged."
)


def protected(e: Entry) -> bool:
    """Pinned entries, rules, identities and instructions: changed by the person only.

    Every automatic path (the model's tool, extraction, replay, dreaming, profile distillation) asks `protected`
    before it changes or removes an entry; only the person (`USER_SOURCES`: a command, the CLI, a hand edit) may.
    """
    return e.pinned or e.type in PROTECTED_TYPES


def automatic(source: str | None) -> bool:
    return source not in USER_SOURCES


def may_change(e: Entry, source: str | None) -> bool:
    """Whether `source` may rewrite, supersede or delete `e`."""
    return not (automatic(source) and protected(e))
