"""Undo keeps what is true (found by a review of the forget stop's own changes): an undone supersede gives
back the whole old line, and the undo of a hand edit that only dropped a line's comment keeps the memory."""

from __future__ import annotations

from tests.trust._history_helpers import Lucid, lucid_fixture  # noqa: F401


def test_undo_of_a_supersede_with_remainder_restores_the_whole_old_line(lucid: Lucid) -> None:
    """我叫小王，在阿里巴巴上班 then 我叫小李 keeps 我在阿里巴巴上班. Undoing that last remember must give back
    the old line as it was. The undo forgets the two new entries (apply_revert → Forget), and the new
    `_cut_from_predecessors` then cuts the remainder's words out of the line the undo just restored."""
    lucid.ok("remember", "我叫小王，在阿里巴巴上班")
    lucid.ok("remember", "我叫小李")
    assert "我在阿里巴巴上班" in lucid.current_texts()
    ran = lucid.ok("undo")
    assert lucid.current_texts() == ["我叫小王，在阿里巴巴上班"], (ran.out, lucid.read("MEMORY.md"))


def test_undo_of_a_hand_edit_that_dropped_a_comment_keeps_the_memory(lucid: Lucid) -> None:
    """Docs: a line whose comment was removed by hand is not a forget (its text survives, with a new id).
    The undo of that edit must not lose the memory: it no longer brings the old id back, and if it takes
    the new id away the fact is gone."""
    lucid.ok("remember", "I am allergic to peanuts")
    lucid.ok("remember", "I like hiking")
    lines = [ln.split(" <!--")[0] if "peanuts" in ln else ln for ln in lucid.read("MEMORY.md").splitlines()]
    lucid.write("MEMORY.md", "\n".join(lines) + "\n")
    lucid.ok("remember", "I live in Paris")  # the writer commits the hand edit first
    assert "I am allergic to peanuts" in lucid.current_texts()
    edits = [r["rev"] for r in lucid.history() if r["message"].startswith("manual edit")]
    ran = lucid(*["undo", edits[0][:10]])
    assert "I am allergic to peanuts" in lucid.current_texts(), (ran.out, ran.err, lucid.read("MEMORY.md"))
