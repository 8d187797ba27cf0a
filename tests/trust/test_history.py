"""History that works: what was true is found after light dreaming archived it, any dream or write can be
undone by revision while later commits leave its entries alone (DREAMS.md never blocks it), a bare undo
takes back the last change to memory, printed hints run as printed, replay dates facts at the message,
and lines added by hand get their recording time."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from memory_core.lineformat import parse_time
from memory_core.namespace import Namespace
from memory_core.ops import Record, Touch
from memory_core.writer import Writer
from tests.fakes.ollama import FakeOllama
from tests.trust._history_helpers import Lucid, at, fact, fake_fixture, lucid_fixture  # noqa: F401
from workers.runtime import build
from workers.settings import Settings


def writer_of(lucid: Lucid, now: str) -> tuple[Writer, Namespace]:
    """The product's writer for this data directory (what a chat turn or the RQ worker uses)."""
    rt = build(Settings(data_dir=lucid.data, now=parse_time(now)))
    return rt.writer, Namespace.of(lucid.tenant, lucid.user, lucid.persona)


def commit_of(lucid: Lucid, prefix: str) -> str:
    [rev] = [r["rev"] for r in lucid.history() if r["message"].startswith(prefix)][:1]
    return rev


class TestAsOfReadsTheArchive:
    def test_a_past_place_is_found_after_light_dreaming_archived_it(self, lucid: Lucid) -> None:
        lucid.ok("remember", "我住在余杭区", now=at(-40))
        lucid.ok("remember", "我住在西湖区", now=at(-10))
        lucid.ok("dream", "--phase", "light")
        assert "我住在余杭区" in lucid.archived_texts()
        assert lucid.recall("我住在哪", "--as-of", at(-20)) == ["我住在余杭区"]
        assert lucid.recall("我住在哪") == ["我住在西湖区"]

    def test_english_past_employer_after_archiving(self, lucid: Lucid) -> None:
        lucid.ok("remember", "I work at Google", "--subject", "employer", now=at(-60))
        lucid.ok("remember", "I work at Microsoft", "--subject", "employer", now=at(-5))
        lucid.ok("dream", "--phase", "light")
        assert lucid.recall("work", "--as-of", at(-30)) == ["I work at Google"]
        assert lucid.recall("work") == ["I work at Microsoft"]

    def test_as_of_before_a_fact_was_said_does_not_return_it(self, lucid: Lucid) -> None:
        lucid.ok("remember", "我对花生过敏", now=at(-1))
        assert lucid.recall("花生过敏", "--as-of", at(-30)) == []
        assert lucid.recall("花生过敏", "--as-of", at(0)) == ["我对花生过敏"]


class TestUndoByRevision:
    def _two_dreams(self, lucid: Lucid) -> str:
        lucid.import_lines(
            [
                fact("dup1", "我喜欢喝黑咖啡", at=at(-40), hits=1),
                fact("dup2", "我喜欢喝黑咖啡了", at=at(-30), hits=2),
            ]
        )
        lucid.ok("dream", "--phase", "light", now=at(-2))
        first = commit_of(lucid, "dream light")
        lucid.ok("remember", "我养了一只猫", now=at(-1))
        lucid.ok("dream", "--phase", "light")  # prepends DREAMS.md again
        return first

    def test_an_older_dream_is_undone_although_later_dreams_prepended_the_journal(self, lucid: Lucid) -> None:
        first = self._two_dreams(lucid)
        assert "我喜欢喝黑咖啡" in lucid.archived_texts()
        ran = lucid.ok("undo", first[:10])
        assert ran.out.startswith(f"undo {first[:10]}: dream light")
        assert sorted(lucid.current_texts()) == ["我养了一只猫", "我喜欢喝黑咖啡", "我喜欢喝黑咖啡了"]
        assert "我喜欢喝黑咖啡" not in lucid.archived_texts()
        journal = lucid.read("DREAMS.md")
        assert len(re.findall(r"^## ", journal, re.M)) == 1  # the later run stays, the undone one leaves
        assert at(0) in journal and at(-2) not in journal

    def test_undo_is_refused_when_a_later_change_touched_the_same_entry(self, lucid: Lucid) -> None:
        first = self._two_dreams(lucid)
        lucid.ok("pin", "dup2")  # the merge's survivor, changed by the user since
        before = lucid.read("MEMORY.md")
        ran = lucid("undo", first[:10])
        assert ran.code == 2 and "later changes touch the same entries (dup2" in ran.err
        assert lucid.read("MEMORY.md") == before

    def test_hit_counts_since_do_not_block_an_undo_and_are_kept(self, lucid: Lucid) -> None:
        lucid.ok("remember", "我住在余杭区", now=at(-3))
        moved = lucid.ok("remember", "我住在西湖区", "--json", now=at(-2)).json()
        rev = lucid.history()[0]["rev"]
        writer, ns = writer_of(lucid, at(-1))
        writer.submit(ns, [Touch(ids=(moved["id"],), at=at(-1))])  # a chat turn recalled it
        lucid.ok("undo", rev[:10])
        assert lucid.current_texts() == ["我住在余杭区"]
        assert lucid.recall("我住在哪") == ["我住在余杭区"]

    def test_undo_of_a_manual_edit_takes_back_its_changes_but_not_a_forget(self, lucid: Lucid) -> None:
        """A line deleted by hand is a forget (its raw lines and profile lines go at once), and a forget is
        never undone: the undo of that edit takes back what else it changed. (It brought the line back
        until a privacy review: a bare `lucid undo` meant for a dream could restore a deleted health fact,
        whose messages were already marked forgotten.)"""
        lucid.ok("remember", "I am allergic to peanuts")
        lucid.ok("remember", "I like hiking")
        lines = lucid.read("MEMORY.md").splitlines()
        lines = [
            ln.replace("I like hiking", "I like hiking in the Alps") for ln in lines if "peanuts" not in ln
        ]
        lucid.write("MEMORY.md", "\n".join(lines))
        lucid.ok("remember", "I live in Paris")  # the writer commits the hand edit first
        edit = commit_of(lucid, "manual edit")
        ran = lucid.ok("undo", edit[:10])
        assert "I am allergic to peanuts" not in lucid.current_texts(), ran.out
        assert "I like hiking" in lucid.current_texts() and "I live in Paris" in lucid.current_texts()


class TestBareUndo:
    def test_it_names_and_takes_back_the_last_memory_change_not_a_message(self, lucid: Lucid) -> None:
        lucid.ok("remember", "我住在余杭区")
        lucid.ok("remember", "我喜欢爬山")
        writer, ns = writer_of(lucid, at(0))
        message = {"id": "m1", "ts": at(0), "speaker": "alice", "text": "你好", "chat": "c1"}
        writer.submit(ns, [Record(message=message)])
        every = lucid.ok("history", "--all", "--json").json()["results"]
        assert every[0]["summary"] == "recorded 1 message" and not every[0]["undoable"]
        shown = lucid.history()[0]  # a commit of messages only is no row of its own
        assert shown["summary"] == "remembered 1 (我喜欢爬山)"
        ran = lucid.ok("undo")
        assert ran.out.startswith(f"undo {shown['rev'][:10]}: remembered 1 (我喜欢爬山)")
        assert lucid.current_texts() == ["我住在余杭区"]
        assert (lucid.root / "raw").is_dir() and "你好" in "".join(
            p.read_text("utf-8") for p in (lucid.root / "raw").iterdir()
        )

    def test_a_hit_count_commit_is_not_what_it_takes_back(self, lucid: Lucid) -> None:
        lucid.ok("remember", "I like hiking")
        tea = lucid.ok("remember", "I am allergic to peanuts", "--json").json()
        writer, ns = writer_of(lucid, at(0))
        writer.submit(ns, [Touch(ids=(tea["id"],), at=at(0))])  # a chat turn used it
        assert lucid.ok("history", "--all", "--json").json()["results"][0]["summary"] == "recall counts"
        assert lucid.history()[0]["summary"] == "remembered 1 (I am allergic to peanuts)"
        ran = lucid.ok("undo")
        assert "remembered 1 (I am allergic to peanuts)" in ran.out
        assert lucid.current_texts() == ["I like hiking"]

    def test_nothing_to_undo_is_a_clear_refusal(self, lucid: Lucid) -> None:
        writer, ns = writer_of(lucid, at(0))
        message = {"id": "m1", "ts": at(0), "speaker": "alice", "text": "hello", "chat": "c1"}
        writer.submit(ns, [Record(message=message)])
        ran = lucid("undo")
        assert ran.code == 2 and "no change to memory left to undo" in ran.err

    def test_repeating_it_steps_further_back_and_an_undo_can_be_redone(self, lucid: Lucid) -> None:
        lucid.ok("remember", "我喜欢爬山")
        lucid.ok("remember", "我对花生过敏")
        lucid.ok("remember", "我住在杭州")
        lucid.ok("undo")
        second = lucid.ok("undo")
        assert "remembered 1 (我对花生过敏)" in second.out
        assert lucid.current_texts() == ["我喜欢爬山"]
        redo = lucid.history()[0]["rev"]  # the newest undo commit, undone by revision: a redo
        lucid.ok("undo", redo[:10])
        assert sorted(lucid.current_texts()) == ["我喜欢爬山", "我对花生过敏"]
        lucid.ok("undo")  # takes the redo back
        assert lucid.current_texts() == ["我喜欢爬山"]

    def test_undoing_the_same_commit_twice_is_a_clear_refusal(self, lucid: Lucid) -> None:
        lucid.ok("remember", "I like hiking")
        rev = lucid.history()[0]["rev"]
        lucid.ok("undo", rev[:10])
        again = lucid("undo", rev[:10])
        assert again.code == 2 and "already undone" in again.err
        assert lucid.current_texts() == []

    def test_undo_of_a_supersede_makes_the_old_value_current_again(self, lucid: Lucid) -> None:
        lucid.ok("remember", "我住在余杭区", now=at(-3))
        lucid.ok("remember", "我住在西湖区", now=at(-2))
        lucid.ok("undo")
        assert lucid.recall("我住在哪") == ["我住在余杭区"]
        assert "西湖区" not in lucid.read("MEMORY.md")


class TestHintsRunAsPrinted:
    def test_the_dream_undo_hint_carries_the_namespace_and_data_dir(self, tmp_path: Path) -> None:
        data = tmp_path / "my data"
        data.mkdir()
        person = Lucid(data, user="alice", persona="p1", tenant="t1")
        person.import_lines(
            [fact("a", "我喜欢喝黑咖啡", at=at(-40)), fact("b", "我喜欢喝黑咖啡了", at=at(-30))]
        )
        out = person.ok("dream", "--phase", "light").out
        [hint] = re.findall(r"undo with `([^`]+)`", out)
        assert (
            "--user alice" in hint and "--persona p1" in hint and "--tenant t1" in hint and "--data" in hint
        )
        ran = person.run_printed(hint)
        assert ran.code == 0, ran.err
        assert sorted(person.current_texts()) == ["我喜欢喝黑咖啡", "我喜欢喝黑咖啡了"]

    def test_the_default_person_gets_no_needless_flags(self, lucid: Lucid) -> None:
        person = Lucid(lucid.data, user="default")
        person.import_lines(
            [fact("a", "I like tea a lot", at=at(-40)), fact("b", "I like tea a lot!", at=at(-30))]
        )
        out = person.ok("dream", "--phase", "light").out
        [hint] = re.findall(r"undo with `([^`]+)`", out)
        assert "--user" not in hint and "--persona" not in hint and "--tenant" not in hint
        assert person.run_printed(hint).code == 0

    def test_the_serve_banner_names_a_data_dir_with_spaces_so_it_runs(self, tmp_path: Path) -> None:
        from bot.serve import _banner

        data = tmp_path / "team memory"
        [line] = [
            ln for ln in _banner(Settings(data_dir=data), "127.0.0.1").splitlines() if "chat --data" in ln
        ]
        words = shlex.split(line.split(":", 1)[1])
        # the program as this process was started (here: python -m bot.cli), then the subcommand
        assert words[-3:] == ["chat", "--data", str(data)]


class TestReplayDatesFactsAtTheMessage:
    def _said(self, lucid: Lucid, when: str, text: str, ident: str) -> None:
        writer, ns = writer_of(lucid, when)
        msg = {"id": ident, "ts": when, "speaker": "alice", "text": text, "chat": "c1", "role": "user"}
        writer.submit(ns, [Record(message=msg)])

    def test_a_replayed_fact_is_valid_from_when_it_was_said(self, lucid: Lucid, fake: FakeOllama) -> None:
        lucid.ok("remember", "我住在余杭区", now=at(-30))
        self._said(lucid, at(-5), "跟你说一下，我搬家了，现在住在西湖区", "m1")
        fake.script("[所在地] 我现在住在西湖区")
        lucid.with_model(fake).ok("dream", "--phase", "replay")
        new = lucid.entry("我现在住在西湖区")
        assert new["valid_from"] == at(-5) and new["current"]
        assert lucid.entry("我住在余杭区")["valid_to"] == at(-5)
        assert lucid.recall("我住在哪", "--as-of", at(-10)) == ["我住在余杭区"]

    def test_a_replayed_older_statement_does_not_end_a_newer_one(
        self, lucid: Lucid, fake: FakeOllama
    ) -> None:
        self._said(lucid, at(-8), "我住在余杭区，离公司有点远", "m1")
        lucid.ok("remember", "我住在西湖区", now=at(-2))
        fake.script("[所在地] 我住在余杭区")
        lucid.with_model(fake).ok("dream", "--phase", "replay")
        assert lucid.recall("我住在哪") == ["我住在西湖区"]
        old = lucid.entry("我住在余杭区")
        assert old["valid_from"] == at(-8) and not old["current"]


class TestHandLinesGetRecorded:
    def test_a_hand_added_line_gets_at_when_the_writer_first_sees_it(self, lucid: Lucid) -> None:
        lucid.ok("remember", "我对花生过敏", now=at(-1))
        lucid.write("MEMORY.md", lucid.read("MEMORY.md").rstrip("\n") + "\n- 我喜欢爬山\n")
        lucid.ok("remember", "我住在杭州", now=at(0))
        line = lucid.line_of("我喜欢爬山")
        assert f"at={at(0)}" in line and "src=manual" in line

    def test_so_an_unused_hand_line_grows_cold_like_any_other(self, lucid: Lucid) -> None:
        lucid.ok("remember", "I live in Paris", now=at(-1))
        lucid.write("MEMORY.md", lucid.read("MEMORY.md").rstrip("\n") + "\n- that noodle place was fine\n")
        lucid.ok("remember", "I like tea", now=at(0))
        lucid.ok("dream", "--phase", "light", now=at(200))
        assert "that noodle place was fine" in lucid.archived_texts()
