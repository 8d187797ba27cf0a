"""`forgetting.purge_blob`: one file of any past commit as `forget --purge` leaves it."""

from __future__ import annotations

from memory_core.forgetting import FORGOTTEN, Forgotten, purge_blob

PROFILE = (
    "# Profile\n\n<!-- lucid:profile digest=0123456789abcdef; updated=2026-01-01T00:00:00Z; facts=2 -->\n\n"
    "- 住在余杭区\n- 喜欢吃四川火锅\n"
)


def test_a_target_whose_words_are_kept_cuts_no_profile_line() -> None:
    """A purge target without text (its words are still held by another entry: only its lines and message
    go) must not count as drawn on by every profile line; the other target's lines still go."""
    targets = [Forgotten("aaaa1111aaaa1111", ""), Forgotten("bbbb2222bbbb2222", "喜欢吃四川火锅")]
    out = purge_blob(PROFILE.encode(), targets).decode()
    assert "- 住在余杭区" in out
    assert "火锅" not in out


def test_a_memory_line_of_the_target_goes_and_its_words_elsewhere_are_cut() -> None:
    memory = (
        "- 我喜欢吃四川火锅 <!--m:id=bbbb2222bbbb2222;t=preference-->\n"
        "- 朋友说我喜欢吃四川火锅 <!--m:id=cccc3333cccc3333;t=fact;scope=group:oc_1-->\n"
        "- 我住在余杭区 <!--m:id=dddd4444dddd4444;t=fact-->\n"
    )
    out = purge_blob(memory.encode(), [Forgotten("bbbb2222bbbb2222", "我喜欢吃四川火锅")]).decode()
    assert "bbbb2222" not in out and f"朋友说{FORGOTTEN}" in out and "我住在余杭区" in out
