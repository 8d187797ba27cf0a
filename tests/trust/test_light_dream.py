"""Light dreaming moves entries between tiers without losing or faking anything: a demoted preference stays
current in the recall tier, a promotion is not the user's pin, and it lapses when the entry goes unused."""

from __future__ import annotations

from tests.trust._history_helpers import Lucid, at, fact, lucid_fixture  # noqa: F401


def tier(lucid: Lucid, text: str) -> str:
    return str(lucid.entry(text)["tier"])


class TestDemotedPreferenceStaysCurrent:
    def test_a_never_recalled_preference_is_demoted_but_not_archived(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("jazz", "我喜欢爵士乐", type="preference", at=at(-200))])
        ran = lucid.ok("dream", "--phase", "light")
        assert "1 demoted" in ran.out and "0 archived" in ran.out
        assert "我喜欢爵士乐" in lucid.current_texts() and tier(lucid, "我喜欢爵士乐") == "recall"
        assert lucid.recall("爵士乐") == ["我喜欢爵士乐"]
        assert "demo=" in lucid.line_of("我喜欢爵士乐") and "pin=1" not in lucid.line_of("我喜欢爵士乐")

    def test_it_stays_current_in_later_runs_too(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("tea", "I prefer green tea", type="preference", at=at(-200))])
        lucid.ok("dream", "--phase", "light")
        lucid.ok("dream", "--phase", "light", now=at(400))
        assert "I prefer green tea" in lucid.current_texts(now=at(400))
        assert lucid.archived_texts() == []

    def test_an_ordinary_cold_fact_is_still_archived(self, lucid: Lucid) -> None:
        lucid.import_lines(
            [fact("n", "那家面馆不错", at=at(-200)), fact("p", "我喜欢民谣", type="preference", at=at(-200))]
        )
        lucid.ok("dream", "--phase", "light")
        assert lucid.archived_texts() == ["那家面馆不错"] and "我喜欢民谣" in lucid.current_texts()


class TestPromotionIsNotAPin:
    def test_a_much_recalled_entry_is_promoted_with_promo_not_pin(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("gym", "我常去的健身房在文三路", at=at(-20), last=at(-1), hits=3)])
        ran = lucid.ok("dream", "--phase", "light")
        assert "1 promoted" in ran.out
        line = lucid.line_of("我常去的健身房在文三路")
        assert f"promo={at(0)[:10]}" in line and "pin=1" not in line
        e = lucid.entry("我常去的健身房在文三路")
        assert e["tier"] == "resident" and not e["pinned"]
        assert "promoted" in lucid.ok("show").out

    def test_a_promotion_unused_for_90_days_returns_to_recall(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("gym", "My gym is on Wensan Road", at=at(-20), last=at(-1), hits=3)])
        lucid.ok("dream", "--phase", "light")
        assert tier(lucid, "My gym is on Wensan Road") == "resident"
        ran = lucid.ok("dream", "--phase", "light", now=at(95))
        assert "1 unpromoted" in ran.out
        assert tier(lucid, "My gym is on Wensan Road") == "recall"
        assert "promo=" not in lucid.line_of("My gym is on Wensan Road")
        assert "My gym is on Wensan Road" in lucid.current_texts(now=at(95))  # back in recall, still true
        again = lucid.ok("dream", "--phase", "light", now=at(96))
        assert "0 promoted" in again.out  # its old hits do not lift it straight back

    def test_the_users_own_pin_never_lapses(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("p", "孩子对花生过敏", at=at(-400), hits=5, pinned=True)])
        lucid.ok("dream", "--phase", "light", now=at(365))
        assert "pin=1" in lucid.line_of("孩子对花生过敏") and tier(lucid, "孩子对花生过敏") == "resident"

    def test_old_hits_without_recent_use_do_not_promote(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("o", "那家烤鸭店在西湖边", at=at(-300), last=at(-120), hits=4)])
        lucid.ok("dream", "--phase", "light")
        assert tier(lucid, "那家烤鸭店在西湖边") == "recall"

    def test_moving_a_promoted_line_under_recall_by_hand_takes_it_back(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("gym", "我常去的健身房在文三路", at=at(-20), last=at(-1), hits=3)])
        lucid.ok("dream", "--phase", "light")
        memory = lucid.read("MEMORY.md")
        line = lucid.line_of("我常去的健身房在文三路")
        memory = memory.replace(line + "\n", "").replace("## Recall\n", f"## Recall\n\n{line}\n")
        lucid.write("MEMORY.md", memory)
        lucid.ok("remember", "我住在杭州")
        assert tier(lucid, "我常去的健身房在文三路") == "recall"

    def test_unpinning_a_promoted_entry_takes_the_promotion_back(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("gym", "I swim on Tuesdays", at=at(-20), last=at(-1), hits=3)])
        lucid.ok("dream", "--phase", "light")
        lucid.ok("pin", "gym", "--unpin")
        assert tier(lucid, "I swim on Tuesdays") == "recall"
