"""Dreaming, the pure part: the phases' API (re-exported from dream_light, dream_deep, dream_replay, profile,
dream_guard, dream_pairs) and the run report every run writes as its commit message and DREAMS.md entry."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .dream_deep import Cluster, Merge, Rejection, apply_deep, plan_clusters, review_reply, validate_merge
from .dream_light import LightOp, LightResult, apply_light, plan_light
from .lineformat import format_time
from .profile import guard_profile, profile_digest, profile_inputs, render_profile

__all__ = [
    "Cluster",
    "DreamReport",
    "LightOp",
    "LightResult",
    "Merge",
    "Rejection",
    "apply_deep",
    "apply_light",
    "commit_message",
    "guard_profile",
    "journal_entry",
    "plan_clusters",
    "plan_light",
    "prepend_journal",
    "profile_digest",
    "profile_inputs",
    "render_profile",
    "review_reply",
    "validate_merge",
]

PHASES = ("light", "deep", "replay", "profile")
MODEL_PHASES = frozenset({"deep", "replay", "profile"})  # the phases that call a dream model
JOURNAL_TITLE = "# Dreams"
JOURNAL_NOTE = (
    "<!-- Journal of dream runs, newest first. Every run is also one git commit: `lucid history`, "
    "`lucid undo REV`. -->"
)
MAX_JOURNAL_RUNS = 400  # older runs stay in git history
MAX_IDS_SHOWN = 40


@dataclass
class DreamReport:
    """What one run of one phase did, for the journal, the commit message, the CLI and the job result."""

    phase: str
    namespace: str
    started: datetime
    status: str = "done"  # done | nothing to do | dry run | skipped
    counts: dict[str, int] = field(default_factory=dict)
    touched: dict[str, list[str]] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # What the rejections quoted (a merge's lost terms, a profile line): shown to whoever ran the run (the
    # CLI, /dream, the job's result), never written to DREAMS.md or a commit, where a forget cannot reach.
    said: list[str] = field(default_factory=list)
    model: str | None = None
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    replans: int = 0
    revision: str | None = None
    dry_run: bool = False

    @property
    def changes(self) -> int:
        """Entries written: what makes a run "something" rather than "nothing to do"."""
        keys = (
            "merged",
            "superseded",
            "archived",
            "promoted",
            "demoted",
            "unpromoted",
            "added",
            "updated",
            "profile",
        )
        return sum(self.counts.get(k, 0) for k in keys)

    def reject(self, reason: str, n: int = 1) -> None:
        self.rejections[reason] = self.rejections.get(reason, 0) + n

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "namespace": self.namespace,
            "started": format_time(self.started),
            "status": self.status,
            "dry_run": self.dry_run,
            "counts": dict(self.counts),
            "touched": {k: list(v) for k, v in self.touched.items()},
            "rejections": dict(self.rejections),
            "notes": list(self.notes),
            "said": list(self.said),
            "model": self.model,
            "llm": {
                "calls": self.llm_calls,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
            },
            "replans": self.replans,
            "revision": self.revision,
        }


def _counts_text(report: DreamReport) -> str:
    parts = [f"{n} {k}" for k, n in report.counts.items() if n]
    return ", ".join(parts)


def commit_message(report: DreamReport) -> str:
    """One honest line: the phase and every non-zero count, rejections included."""
    counts = _counts_text(report)
    if not report.changes:
        counts = "nothing to do" + (f" ({counts})" if counts else "")
    rejected = sum(report.rejections.values())
    if rejected:
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(report.rejections.items()))
        counts += f"; {rejected} rejected ({reasons})"
    return f"dream {report.phase}: {counts}"


def _ids(ids: list[str]) -> str:
    shown = ", ".join(ids[:MAX_IDS_SHOWN])
    return shown + (f" (+{len(ids) - MAX_IDS_SHOWN} more)" if len(ids) > MAX_IDS_SHOWN else "")


def journal_entry(report: DreamReport) -> str:
    """The DREAMS.md section of one run."""
    head = f"## {format_time(report.started)} · {report.phase}"
    if report.changes:
        head += f" · {_counts_text(report)}"
    else:
        head += " · NOTHING TO DO (0 changes)"
    lines = [head, ""]
    counts = " · ".join(f"{k} {n}" for k, n in report.counts.items()) or "none"
    lines.append(f"- counts: {counts}")
    for action, ids in report.touched.items():
        if ids:
            lines.append(f"- {action}: {_ids(ids)}")
    rejections = ", ".join(f"{r} {n}" for r, n in sorted(report.rejections.items())) or "none"
    lines.append(f"- rejections: {rejections}")
    model = report.model or "none"
    lines.append(
        f"- model: {model} · {report.llm_calls} calls · {report.prompt_tokens} prompt + "
        f"{report.completion_tokens} completion tokens"
    )
    if report.replans:
        lines.append(f"- re-planned {report.replans}× (the namespace changed while the model ran)")
    lines.extend(f"- note: {n}" for n in report.notes)
    return "\n".join(lines) + "\n"


def prepend_journal(existing: str | None, entry: str) -> str:
    """DREAMS.md with `entry` on top, keeping at most MAX_JOURNAL_RUNS runs (git keeps the rest)."""
    runs: list[str] = []
    if existing:
        body = existing.split("\n## ", 1)
        if len(body) == 2:
            runs = ["## " + r for r in body[1].split("\n## ")]
    runs = [entry.rstrip("\n") + "\n", *(r.rstrip("\n") + "\n" for r in runs)][:MAX_JOURNAL_RUNS]
    return f"{JOURNAL_TITLE}\n\n{JOURNAL_NOTE}\n\n" + "\n".join(runs)
