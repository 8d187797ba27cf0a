"""`lucid history` as a person reads it (words, newest first, the revision `lucid undo` takes) and `lucid
undo` on the rows it shows: the real command in-process, real files and git."""

from __future__ import annotations

import re

from tests.trust._history_helpers import Lucid, at, fact, lucid_fixture  # noqa: F401

ROW = re.compile(r"^([0-9a-f]{10})  (\S+)  (.*?)(?:  \[undone by ([0-9a-f]{10})\])?$")


def shown(lucid: Lucid, *flags: str) -> list[tuple[str, str, str | None]]:
    """(revision, words, undone by) of each printed row."""
    out = []
    for line in lucid.ok("history", *flags).out.splitlines():
        m = ROW.match(line)
        assert m, line
        out.append((m.group(1), m.group(3), m.group(4)))
    return out


def test_rows_say_what_changed_and_json_gives_the_same(lucid: Lucid) -> None:
    lucid.ok("remember", "我在余杭区", now=at(-30))
    lucid.ok("remember", "我喜欢爬山", now=at(-30))
    lucid.ok("remember", "我在西湖区", now=at(-20))
    nut = lucid.ok("remember", "我对花生过敏", "--json", now=at(-20)).json()["id"]
    lucid.ok("forget", nut)
    assert [words for _, words, _ in shown(lucid)] == [
        "forgot 1",
        "remembered 1",  # its words left with the entry
        "superseded 1 (我在余杭区 → 我在西湖区)",
        "remembered 1 (我喜欢爬山)",
        "remembered 1 (我在余杭区)",
    ]
    data = lucid.history()
    assert [(r["rev"][:10], r["summary"], r["undone_by"]) for r in data] == shown(lucid)
    [change] = data[2]["changes"]
    assert (change["verb"], change["was"], change["text"]) == ("superseded", "我在余杭区", "我在西湖区")
    assert data[2]["message"] == "memory: 1 superseded"  # plain `git log` keeps its own line


def test_undo_takes_any_row_by_its_printed_revision_and_the_rows_follow(lucid: Lucid) -> None:
    lucid.import_lines(
        [fact("d1", "我喜欢喝黑咖啡", at=at(-40), hits=1), fact("d2", "我喜欢喝黑咖啡了", at=at(-30), hits=2)]
    )
    lucid.ok("dream", "--phase", "light", now=at(-2))
    lucid.ok("remember", "我养了一只猫", now=at(-1))
    rows = shown(lucid)
    assert rows[0][1] == "remembered 1 (我养了一只猫)"
    dream_rev, dream_words, _ = rows[1]
    assert dream_words.startswith("dream light: ") and "merged" in dream_words
    assert rows[2][1].startswith("remembered 2")  # the import, one row

    ran = lucid.ok("undo", dream_rev)  # an older row, by the revision printed
    assert ran.out.startswith(f"undo {dream_rev}: {dream_words} → ")
    after = shown(lucid)
    assert after[0][1] == f"undo of {dream_rev}: {dream_words}"
    assert (after[2][0], after[2][2]) == (dream_rev, after[0][0])  # marked undone by that commit

    bare = lucid.ok("undo")  # the newest row not undone and not an undo: the cat
    assert bare.out.startswith(f"undo {rows[0][0]}: remembered 1 (我养了一只猫)")
    assert "我养了一只猫" not in lucid.current_texts()
    again = lucid("undo", dream_rev)
    assert again.code == 2 and "already undone" in again.err


def test_all_shows_the_commits_that_only_recorded_messages(lucid: Lucid) -> None:
    lucid.ok("remember", "I like hiking")
    lucid.import_lines(
        [{"kind": "message", "id": "m1", "ts": at(0), "speaker": "alice", "text": "hello", "session": "s"}]
    )
    assert [w for _, w, _ in shown(lucid)] == ["remembered 1 (I like hiking)"]
    every = shown(lucid, "--all")
    assert [w for _, w, _ in every] == ["recorded 1 message", "remembered 1 (I like hiking)"]
    assert lucid.ok("undo").out.startswith(f"undo {every[1][0]}: remembered 1 (I like hiking)")


def test_an_empty_history_says_so(lucid: Lucid) -> None:
    assert lucid.ok("history").out.strip() == "(no change to memory yet)"
    assert lucid.ok("history", "--json").json() == {"results": []}


def test_a_line_copied_by_hand_is_a_new_memory_and_undo_takes_only_it_back(lucid: Lucid) -> None:
    """A person copies a line (its id comes along) and changes the copy, above or below the original: the
    copy is a new memory with an id of its own, not an unreadable duplicate, and undoing the hand edit
    removes the copy and keeps the original as it was."""
    lucid.ok("remember", "我在余杭区", now=at(-3))
    original = lucid.line_of("我在余杭区")
    memory = lucid.read("MEMORY.md")
    lucid.write("MEMORY.md", memory.replace(original, original.replace("余杭区", "西湖区") + "\n" + original))
    lucid.ok("remember", "我养了一只猫", now=at(-2))

    assert lucid.line_of("我在余杭区") == original  # the original keeps its id and everything else
    assert sorted(lucid.current_texts()) == ["我养了一只猫", "我在余杭区", "我在西湖区"]
    assert "unreadable" not in lucid.ok("show").out
    rows = shown(lucid)
    assert rows[1][1] == "hand edit: 1 added"

    lucid.ok("undo", rows[1][0])
    assert sorted(lucid.current_texts()) == ["我养了一只猫", "我在余杭区"]
    assert lucid.line_of("我在余杭区") == original


def test_undo_never_brings_a_forgotten_memory_back(lucid: Lucid) -> None:
    """Forget means forget: a bare `lucid undo` after a forget (or an undo of that row) refuses, and
    the forgotten line stays gone; an undo of an undo still restores what the first undo took back."""
    lucid.ok("remember", "我住在余杭区", now=at(-3))
    nut = lucid.ok("remember", "我对花生过敏", "--json", now=at(-2)).json()["id"]
    lucid.ok("forget", nut)
    ran = lucid("undo")
    assert ran.code != 0 and "forgotten" in ran.err
    assert "花生" not in lucid.read("MEMORY.md") and lucid.current_texts() == ["我住在余杭区"]

    cat = lucid.ok("remember", "我养了一只猫", now=at(-1))
    assert cat.code == 0
    first = lucid.ok("undo")  # takes the cat back (a forget made by an undo)
    assert "我养了一只猫" not in lucid.current_texts()
    lucid.ok("undo", shown(lucid)[0][0])  # the undo of that undo brings it back
    assert "我养了一只猫" in lucid.current_texts() and first.code == 0
