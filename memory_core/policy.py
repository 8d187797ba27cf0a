"""The one protection rule: what only the person's own act may change.

Every automatic path — the model's `manage_memory` tool, extraction, replay, light and deep dreaming, profile
distillation — asks `protected` before it changes or removes an entry, and `automatic` says whether a source
is such a path. Pinned entries, rules, identities and standing instructions change only by the user: by a
command, the CLI or a hand edit (`USER_SOURCES`).
"""

from __future__ import annotations

from .entry import Entry

#: Sources a person speaks through; every other source is automatic.
USER_SOURCES = frozenset({"user", "manual"})
#: Types no automatic path may change (besides pinned entries).
PROTECTED_TYPES = frozenset({"rule", "identity", "instruction"})

#: What an automatic path is told when it reaches for a protected entry; the model relays it to the user.
REFUSAL = (
    "This memory is protected (pinned, a rule, an identity or a standing instruction): only the person can "
    "change or delete it themselves, with /forget, /unpin or by editing MEMORY.md. Tell them so; it was left "
    "unchanged."
)


def protected(e: Entry) -> bool:
    """Pinned entries, rules, identities and instructions: changed by the person only."""
    return e.pinned or e.type in PROTECTED_TYPES


def automatic(source: str | None) -> bool:
    return source not in USER_SOURCES


def may_change(e: Entry, source: str | None) -> bool:
    """Whether `source` may rewrite, supersede or delete `e`."""
    return not (automatic(source) and protected(e))
