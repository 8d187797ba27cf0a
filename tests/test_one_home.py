"""Each shared rule has one home (issue 13): memory_core/policy.py is the only file that spells a CJK range,
and the per-phase tables of workers/ name exactly the phases memory_core.dream lists."""

from __future__ import annotations

import re
from pathlib import Path

from memory_core.dream import MODEL_PHASES, PHASES
from workers.dreaming import BUDGETS
from workers.settings import DREAM_INTERVALS

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "memory_core" / "policy.py"
HERE = Path(__file__).resolve()
# The ends of the Han blocks, as escapes (\u4e00, "\u9FFF") or as the characters themselves around a dash.
HAN_BOUND = re.compile(r"\\u(?:3400|4dbf|4e00|9fa5|9fff)|[㐀一]-|-[龥鿿]", re.I)


def _sources() -> list[Path]:
    dirs = ("memory_core", "bot", "workers", "bench", "tests")
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py") if p not in (POLICY, HERE))


def test_only_policy_spells_a_cjk_range() -> None:
    assert HAN_BOUND.search(POLICY.read_text("utf-8")), "the check no longer recognises policy.HAN"
    spelt = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in _sources()
        for n, line in enumerate(p.read_text("utf-8").splitlines(), 1)
        if HAN_BOUND.search(line)
    ]
    assert spelt == [], "import HAN (or KANA, WIDE) from memory_core.policy instead"


def test_every_phase_has_a_schedule_and_every_model_phase_a_budget() -> None:
    # A phase missing from DREAM_INTERVALS is never scheduled; a model phase without a budget fails its run.
    assert list(DREAM_INTERVALS) == list(PHASES)
    assert set(BUDGETS) == MODEL_PHASES
