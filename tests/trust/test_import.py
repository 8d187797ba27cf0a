"""Import keeps what the file says: `supersedes` ends the entry it names, and `--upsert` keeps the file's
ids and dates while still applying the upsert rules."""

from __future__ import annotations

from tests.trust._history_helpers import Lucid, at, fact, lucid_fixture  # noqa: F401


class TestImportHonoursSupersedes:
    def test_a_fact_that_supersedes_an_entry_in_memory_ends_it(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("old", "我住在余杭区", at=at(-40))])
        lucid.import_lines([fact("new", "我住在西湖区", valid_from=at(-10), supersedes=["old"])])
        assert lucid.current_texts() == ["我住在西湖区"]
        assert lucid.entry("我住在余杭区")["valid_to"] == at(-10)
        assert lucid.recall("我住在哪", "--as-of", at(-20)) == ["我住在余杭区"]

    def test_order_in_the_file_does_not_matter(self, lucid: Lucid) -> None:
        lucid.import_lines(
            [
                fact("c", "I work at Stripe", valid_from=at(-5), supersedes=["b"]),
                fact("b", "I work at Google", valid_from=at(-50), supersedes=["a"]),
                fact("a", "I work at IBM", valid_from=at(-300)),
            ]
        )
        assert lucid.current_texts() == ["I work at Stripe"]
        assert lucid.entry("I work at Google")["valid_to"] == at(-5)
        assert lucid.entry("I work at IBM")["valid_to"] == at(-50)

    def test_an_entry_that_already_ended_keeps_its_own_end(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("old", "我在字节跳动工作", valid_to=at(-100))])
        lucid.import_lines([fact("new", "我在阿里巴巴工作", valid_from=at(-10), supersedes=["old"])])
        assert lucid.entry("我在字节跳动工作")["valid_to"] == at(-100)


class TestUpsertKeepsIdsAndDates:
    def test_ids_and_dates_of_the_file_survive_upsert(self, lucid: Lucid) -> None:
        lucid.import_lines(
            [fact("f-peanut", "我对花生过敏", at=at(-200), valid_from=at(-365))], "--upsert", now=at(0)
        )
        e = lucid.entry("我对花生过敏")
        assert e["id"] == "f-peanut" and e["at"] == at(-200) and e["valid_from"] == at(-365)

    def test_upsert_still_supersedes_at_the_files_date(self, lucid: Lucid) -> None:
        lucid.ok("remember", "I live in London", now=at(-90))
        lucid.import_lines([fact("paris", "I live in Paris", valid_from=at(-30))], "--upsert")
        assert lucid.current_texts() == ["I live in Paris"]
        assert lucid.entry("I live in London")["valid_to"] == at(-30)
        assert lucid.entry("I live in Paris")["id"] == "paris"

    def test_an_older_upserted_value_is_history_not_current(self, lucid: Lucid) -> None:
        lucid.ok("remember", "我住在西湖区", now=at(-5))
        lucid.import_lines([fact("yh", "我住在余杭区", valid_from=at(-100))], "--upsert")
        assert lucid.recall("我住在哪") == ["我住在西湖区"]
        assert lucid.recall("我住在哪", "--as-of", at(-50)) == ["我住在余杭区"]

    def test_upsert_with_supersedes_is_written_as_given(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("old", "我喜欢喝咖啡", at=at(-40))])
        lucid.import_lines(
            [fact("new", "我不喝咖啡了，改喝茶", valid_from=at(-3), supersedes=["old"])], "--upsert"
        )
        assert lucid.current_texts() == ["我不喝咖啡了，改喝茶"]
        assert lucid.entry("我不喝咖啡了，改喝茶")["id"] == "new"

    def test_a_taken_id_is_not_reused_by_upsert(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("x1", "I like tea")])
        lucid.import_lines([fact("x1", "My cat is called Mimi")], "--upsert")
        e = lucid.entry("My cat is called Mimi")
        assert e["id"] != "x1" and lucid.entry("I like tea")["id"] == "x1"


class TestAnImportNeverOverwrites:
    """A fact whose id is already taken by another text is a change, not an overwrite: the old text stays
    as history, and a pinned one is not the import's to change."""

    def test_another_text_under_a_known_id_supersedes_it(self, lucid: Lucid) -> None:
        ident = lucid.ok("remember", "我住在余杭区", "--json").json()["id"]
        lucid.import_lines([fact(ident, "我住在西湖区")])
        assert lucid.current_texts() == ["我住在西湖区"]
        assert lucid.entry("我住在余杭区")["valid_to"]  # kept, as history

    def test_a_pinned_line_is_not_the_imports_to_change(self, lucid: Lucid) -> None:
        ident = lucid.ok("remember", "我对花生过敏", "--pin", "--json").json()["id"]
        ran = lucid.import_lines([fact(ident, "我喜欢花生")])
        assert lucid.current_texts() == ["我对花生过敏"]
        assert "rejected" in ran.out + ran.err or "protected" in ran.out + ran.err
        assert "pin=1" in lucid.line_of("我对花生过敏")

    def test_the_same_fact_imported_again_changes_nothing(self, lucid: Lucid) -> None:
        lucid.import_lines([fact("same", "我住在余杭区", at=at(-3))])
        lucid.import_lines([fact("same", "我住在余杭区", at=at(-3))])
        assert lucid.current_texts() == ["我住在余杭区"] and not lucid.archived_texts()
