"""Explicit sharing of a private entry with the person's groups (DESIGN §5), applied by the writer: the
`share=1` metadata key, read only by `recall.visible_in`."""

from __future__ import annotations

from .book import Book
from .ops import Outcome, Share
from .policy import automatic
from .recall import SHARE_KEY, is_shared
from .sensitive import sensitive_categories


def share(book: Book, op: Share) -> Outcome:
    entry = book.memory.entries.get(op.id)
    if entry is None:
        return Outcome(op.op_id, "rejected:not_found", detail=f"no current entry {op.id}")
    if entry.scope not in (None, "p2p"):
        return Outcome(
            op.op_id, "rejected:invalid", id=op.id, detail="learned in a group: seen there already"
        )
    found = sensitive_categories(entry.text)
    if op.shared and found and automatic(op.source):
        detail = f"sensitive ({', '.join(sorted(found))}): only the person can share it, with /share"
        return Outcome(op.op_id, "rejected:sensitive", id=op.id, detail=detail)
    if is_shared(entry) == op.shared:
        return Outcome(op.op_id, "unchanged", id=op.id)
    extra = tuple((k, v) for k, v in entry.extra if k != SHARE_KEY)
    book.replace_entry(entry.with_changes(extra=(*extra, (SHARE_KEY, "1")) if op.shared else extra))
    return Outcome(op.op_id, "updated", id=op.id)
