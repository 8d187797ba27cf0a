"""`lucid history` in words, and a bare `lucid undo` taking back exactly the row it shows first: the real
writer on a real git repository (pygit2), no Redis."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from memory_core.history import _changed_lines, describe, rows, states, undo
from memory_core.lineformat import format_time
from memory_core.namespace import Namespace
from memory_core.ops import Edit, Forget, Pin, Record, Remember, Touch
from memory_core.store import MEMORY
from memory_core.writer import Writer

NS = Namespace.of("t", "alice", "p")


def say(writer: Writer, text: str) -> str:
    outcome = writer.submit(NS, [Remember(text)])[0]
    assert outcome.ok and outcome.id, outcome
    return outcome.id


def message(n: int, text: str = "你好") -> Record:
    when = format_time(datetime.now(UTC))
    return Record(message={"id": f"m{n}", "ts": when, "speaker": "alice", "text": text, "chat": "c1"})


def summaries(writer: Writer, every: bool = False) -> list[str]:
    return [r.summary for r in rows(writer.store, NS, every=every)]


def test_each_commit_reads_as_what_it_changed(local_writer: Writer) -> None:
    w = local_writer
    say(w, "我在余杭区")
    hike = w.submit(NS, [message(1), Remember("我喜欢爬山")])[1].id  # a turn: its message folds in
    assert hike
    w.submit(NS, [message(2)])
    w.submit(NS, [Touch(ids=(hike,), at=format_time(datetime.now(UTC)))])
    assert summaries(w, every=True)[0] == "recorded 1 message"  # shown only with --all
    assert summaries(w)[0] == "remembered 1 (我喜欢爬山)"
    say(w, "我在西湖区")  # the message and the hit count above fold into this commit
    w.submit(NS, [Pin(hike)])
    w.submit(NS, [Edit(hike, "我很喜欢爬山")])
    assert summaries(w) == [  # each in the words of its time
        "reworded 1 (我喜欢爬山 → 我很喜欢爬山)",
        "pinned 1 (我喜欢爬山)",
        "superseded 1 (我在余杭区 → 我在西湖区)",
        "remembered 1 (我喜欢爬山)",
        "remembered 1 (我在余杭区)",
    ]
    shown = rows(w.store, NS)
    assert [r.messages for r in shown] == [0, 0, 1, 1, 0]
    assert all(r.undoable and r.undone_by is None for r in shown)
    assert summaries(w, every=True) == summaries(w)  # nothing left that only recorded or counted


def test_words_of_a_forgotten_entry_never_come_back(local_writer: Writer) -> None:
    w = local_writer
    nut = say(w, "我对花生过敏")
    say(w, "我住在杭州")
    w.submit(NS, [Forget(nut)])
    assert summaries(w) == ["forgot 1", "remembered 1 (我住在杭州)", "remembered 1"]
    shown = json.dumps([r.to_json() for r in rows(w.store, NS, every=True)], ensure_ascii=False)
    assert "花生" not in shown and nut in shown  # the id says which entry, the words are gone


def test_a_hand_edit_reads_as_one(local_writer: Writer) -> None:
    w = local_writer
    say(w, "I like tea")
    say(w, "I live in Paris")
    path = w.store.file(NS, MEMORY)
    path.write_text(path.read_text("utf-8").replace("I like tea", "I like green tea"), "utf-8")
    say(w, "I have a cat")  # the writer commits the hand edit first, as its own commit
    assert summaries(w)[:2] == ["remembered 1 (I have a cat)", "hand edit: 1 changed"]


def test_a_bare_undo_takes_back_the_first_row_and_again_steps_further_back(local_writer: Writer) -> None:
    w = local_writer
    for text in ("我喜欢爬山", "我对花生过敏", "我住在杭州"):
        say(w, text)
    first = rows(w.store, NS)[0]
    done = undo(w, NS)
    assert done.rev == first.rev and done.summary == "remembered 1 (我住在杭州)"
    top, undone = rows(w.store, NS)[:2]
    assert top.summary == f"undo of {first.rev[:10]}: remembered 1"
    assert done.revision and top.rev.startswith(done.revision)
    assert undone.rev == first.rev and undone.undone_by == top.rev

    second = undo(w, NS)  # not the undo just made: the next change back
    assert second.summary == "remembered 1 (我对花生过敏)"

    redo = undo(w, NS, top.rev)  # an undo undone by revision puts the change back
    shown = rows(w.store, NS)
    assert shown[0].rev.startswith(redo.revision or "-")
    assert shown[0].summary == f"undo of {top.rev[:10]}: undo of {first.rev[:10]}: remembered 1 (我住在杭州)"
    assert next(r for r in shown if r.rev == first.rev).undone_by is None  # its undo is undone

    back = undo(w, NS)  # a bare undo right after takes that redo back …
    assert back.rev == shown[0].rev
    again = undo(w, NS)  # … and the next one steps further back: it never re-applies what it took back
    assert again.summary == "remembered 1 (我喜欢爬山)"
    book, _ = w.snapshot(NS)
    assert [e.text for e in book.entries()] == []


def test_reading_only_the_changed_lines_gives_what_a_full_parse_gives(local_writer: Writer) -> None:
    w = local_writer
    home = say(w, "我在余杭区")
    tea = say(w, "I like tea")
    nut = say(w, "我对花生过敏")
    say(w, "我在西湖区")
    w.submit(NS, [Pin(tea), Touch(ids=(tea, nut), at=format_time(datetime.now(UTC)))])
    w.transact(NS, lambda book, snap: book.move_to_archive(home), "dream light: 1 archived")
    w.submit(NS, [Forget(nut)])
    path = w.store.file(NS, MEMORY)
    path.write_text(path.read_text("utf-8").replace("I like tea", "I like green tea"), "utf-8")
    say(w, "I have a cat")  # commits that hand edit first
    path.write_text(path.read_text("utf-8") + "- 手写的一行\n", "utf-8")  # no id of its own
    say(w, "I have a dog")
    fast_reads = 0
    for commit in w.store.history(NS, limit=100):
        before, after = w.store.files_at(NS, commit["rev"] + "^"), w.store.files_at(NS, commit["rev"])
        old, new = states(before), states(after)
        fast = _changed_lines(before, after)
        if fast is None:
            continue
        fast_reads += 1
        seen = set(fast[0]) | set(fast[1])
        assert {i for i in set(old) | set(new) if old.get(i) != new.get(i)} <= seen, commit["message"]
        assert all(fast[0].get(i) == old.get(i) and fast[1].get(i) == new.get(i) for i in seen)
    assert fast_reads >= 8  # the writer's own commits; a line without an id takes the full parse
    assert summaries(w)[:4] == [
        "remembered 1 (I have a dog)",
        "hand edit: 1 added",
        "remembered 1 (I have a cat)",
        "hand edit: 1 changed",
    ]


def test_a_second_hand_written_copy_of_a_line_is_read_as_the_full_parse_reads_it() -> None:
    before = {MEMORY: "# Memory\n\n## Recall\n- 手写的一行\n"}
    after = {MEMORY: before[MEMORY] + "- 手写的一行\n"}  # its id is salted by the copy above it
    old, new = states(before), states(after)
    [added] = set(new) - set(old)
    assert _changed_lines(before, after) is None  # no shortcut: the full parse tells the copy apart
    assert [c.verb for c in describe(before, after)] == ["remembered"] and added in new
