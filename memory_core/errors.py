"""The small error tree of the memory library; docs/ARCHITECTURE.md ("Errors") draws the whole tree."""

from __future__ import annotations


class LucidError(Exception):
    """Base class of every error the memory library raises on purpose."""


class InvalidInput(LucidError):
    """Input that cannot be accepted as given; the message says why."""


class ImportFormatError(InvalidInput):
    """A line of an import file is not valid; nothing of the file was applied."""

    def __init__(self, line_no: int, reason: str) -> None:
        super().__init__(f"line {line_no}: {reason}")
        self.line_no = line_no
        self.reason = reason


class LineError(InvalidInput, ValueError):
    """A line that looks like an entry but cannot be read; it is kept verbatim and reported."""


class NotFound(LucidError):
    """The entry, message or namespace asked for does not exist."""


class LeaseLost(LucidError):
    """The writer no longer holds the namespace: its write was refused (fencing)."""


class ConcurrentEdit(LucidError):
    """The namespace kept changing under the writer; the batch was not applied."""


class UndoRefused(LucidError):
    """An undo was not done: later commits changed the same entries, or the commit changed no memory."""


class StaleIndex(LucidError):
    """The cached index cannot be used (missing, other format or tokenizer, torn): rebuild it."""


class StoreError(LucidError):
    """The file system or git failed; the previous state of every file is intact."""


class UnsafePath(StoreError):
    """A file or folder under the data directory is a symbolic link: Lucid never follows one, so a planted
    link cannot make it read or write outside the data directory."""


class ConcurrentChange(StoreError):
    """A tracked file changed on disk between the batch's read and its write (a hand edit raced us)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} changed while the batch was being written")
        self.name = name
