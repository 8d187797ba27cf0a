"""The upsert's dedup index, built in bulk or from saved keys (a leader that never read the namespace), answers
exactly as one built entry by entry and as a scan of every entry by the index's own definition, across
random adds, edits and removes; and a writer in a fresh process decides as one that read the namespace."""

from __future__ import annotations

import gc
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from memory_core import meaning, similarity
from memory_core.book import _DedupIndex, _keys_of, _known_keys
from memory_core.entry import Entry
from memory_core.namespace import Namespace
from memory_core.ops import Forget, Remember
from memory_core.store import Store
from memory_core.writer import Writer

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
NS = Namespace.of("t1", "u1", "default")

_PEOPLE = ["我", "用户", "我的同事张三", "I", "My sister"]
_SAY = [
    "喜欢",
    "不喜欢",
    "住在",
    "不再住在",
    "有2个",
    "有3个",
    "在字节跳动工作",
    "like",
    "no longer like",
    "live in",
]
_THINGS = ["咖啡", "乌龙茶", "杭州", "西湖区", "猫", "孩子", "Python", "Paris", "跑步", "coffee"]
_SLOTS = [
    "我的猫叫小白",
    "我的猫叫一只很胖的橘色咪咪",
    "我的手机号换成了新号",
    "my car is red",
    "my car is a very old green Toyota",
]
_MEET = [
    "我的猫叫小白",
    "我的猫叫一只很胖的橘色咪咪",
    "my car is a very old green Toyota",
    "我住在杭州",
    "我住在北京",
]
_FILL = ["", "现在", "真的", "一直", "really ", "，", "。"]

_texts = st.one_of(
    st.builds(lambda p, f, s, t: f"{p}{f}{s}{t}", *map(st.sampled_from, (_PEOPLE, _FILL, _SAY, _THINGS))),
    st.builds(lambda s, f: f + s, st.sampled_from(_SLOTS), st.sampled_from(_FILL)),
    st.text(alphabet="我的猫狗在杭州不喜欢咖啡 ab1", min_size=0, max_size=8),
)


def _grams(text: str) -> frozenset[str]:
    return similarity.bigrams(meaning.read(text).core)


def _scan(entries: dict[str, Entry], text: str) -> tuple[list[str], list[str]]:
    """(same text, candidates) by the definition, over every entry: what the index must answer."""
    mine, r = _grams(text), meaning.read(text)
    same, wanted = [], []
    for e in entries.values():
        theirs, o = _grams(e.text), meaning.read(e.text)
        if similarity.normalise(e.text) == similarity.normalise(text):
            same.append(e.id)
        n = len(mine & theirs)
        alike = n > 0 and (
            n / (len(mine) + len(theirs) - n) >= meaning.CANDIDATE or n == min(len(mine), len(theirs))
        )
        if alike or r.frame == o.frame or (r.slot and o.slot and r.slot[0] == o.slot[0]):
            wanted.append(e.id)
    return sorted(same), sorted(wanted)


def _answers(index: _DedupIndex, text: str) -> tuple[list[str], list[str]]:
    return [e.id for e in index.same(text, T0)], [e.id for e in index.candidates(text, T0)]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_the_bulk_and_the_saved_index_answer_as_the_one_built_entry_by_entry(data: st.DataObject) -> None:
    # statements that meet only by their slot or their frame are always among those drawn from
    texts = data.draw(st.lists(_texts, max_size=25)) + data.draw(
        st.lists(st.sampled_from(_MEET), unique=True)
    )
    entries = {f"e{i:03d}": Entry(id=f"e{i:03d}", text=t) for i, t in enumerate(texts) if t.strip()}
    bulk = _DedupIndex(entries)
    one_by_one = _DedupIndex({})
    for e in entries.values():
        one_by_one.add(e)
    one_by_one.rebase(entries)
    saved = _DedupIndex(entries, _known_keys(bulk.dump(), entries))
    assert saved.missed == 0  # every text came from the saved keys
    probes = data.draw(st.lists(_texts, min_size=1, max_size=6)) + texts[:4] + _MEET
    for step in range(3):
        for text in probes:
            expected = _scan(entries, text)
            assert _answers(bulk, text) == _answers(one_by_one, text) == _answers(saved, text) == expected
        # another batch: some entries edited or removed, some added, applied to each index its own way
        ids = sorted(entries)
        gone = data.draw(st.lists(st.sampled_from(ids), max_size=3, unique=True)) if ids else []
        edited = data.draw(st.lists(st.sampled_from(ids), max_size=3, unique=True)) if ids else []
        for i in gone:
            bulk.remove(entries.pop(i))
        for i in edited:
            if i in entries:
                entries[i] = Entry(id=i, text=data.draw(_texts) or "x")
                bulk.add(entries[i])  # as Book does: the dict it serves is updated in place
        for j, t in enumerate(data.draw(st.lists(_texts, max_size=4))):
            if t.strip():
                entries[f"n{step}{j}"] = Entry(id=f"n{step}{j}", text=t)
                bulk.add(entries[f"n{step}{j}"])
        one_by_one.rebase(entries)
        saved = _DedupIndex(
            entries, _known_keys(saved.dump(), entries)
        )  # the next cold leader, from the last save


def test_saved_keys_from_other_code_or_that_disagree_are_not_used() -> None:
    entries = {"a": Entry(id="a", text="我的猫叫小白"), "b": Entry(id="b", text="我住在杭州")}
    saved = json.loads(_DedupIndex(entries).dump())
    assert _known_keys(json.dumps(saved).encode(), entries) is not None
    wrong_frame = {
        **saved,
        "rows": [x.replace("f:", "f:x") if x.startswith("f:") else x for x in saved["rows"]],
    }
    other_code = {**saved, "probe": "0" * 16}
    for doc in (wrong_frame, other_code, {"rows": saved["rows"]}, {**saved, "rows": saved["rows"][:-1]}):
        assert _known_keys(json.dumps(doc).encode(), entries) is None
    assert _known_keys(b"\xff not json", entries) is None
    lied = _DedupIndex(entries, _known_keys(json.dumps(wrong_frame).encode(), entries))
    assert lied.missed == 2  # read from the text again
    assert [e.id for e in lied.candidates("我的猫叫小黑", T0)] == ["a"]


def test_a_fresh_writer_decides_as_one_that_read_the_namespace(data_dir: Path, tmp_path: Path) -> None:
    """A process that never read the namespace takes the keys the last leader saved; what it decides (the
    same text, a rewording, a slot that changes) is what a writer without them decides, and a forget leaves
    no trace of the text in the saved keys."""
    store = Store(data_dir)
    texts = [f"我的第{i}个爱好是收集{i}号邮票" for i in range(300)] + ["我的猫叫小白", "我住在杭州西湖区"]
    Writer(store, clock=lambda: T0).submit(NS, [Remember(text=t) for t in texts])
    assert store.load_cache(NS, "dedup") is None  # one process grew it: nobody read it cold yet
    Writer(store, clock=lambda: T0).submit(NS, [Remember(text="我喜欢喝乌龙茶")])
    assert store.load_cache(NS, "dedup") is not None  # a new process read 302 texts: it saved their keys
    plain = tmp_path / "plain"
    shutil.copytree(data_dir, plain, symlinks=True)
    shutil.rmtree(Store(plain).path(NS) / ".index")
    ops = [
        Remember(text=t)
        for t in ("我的猫叫小白", "我的猫叫小黑", "我现在住在杭州西湖区", "我的第7个爱好是收集8号邮票")
    ]
    later = T0 + timedelta(hours=1)
    cold, reference = Writer(store, clock=lambda: later), Writer(Store(plain), clock=lambda: later)
    got = [o.status for o in cold.submit(NS, ops)]
    assert got == [o.status for o in reference.submit(NS, ops)]
    assert got[0] == "unchanged" and got[1].startswith("superseded")
    book = cold._books[NS][1]
    assert book.index_missed < 10  # it read only the new texts, not the whole file
    saved = store.load_cache(NS, "dedup")
    assert saved is not None and "小白" in saved[1]("keys.json").decode()
    cat = next(e for e in book.entries() if e.text == "我的猫叫小白")
    assert [o.status for o in cold.submit(NS, [Forget(id=cat.id)])] == ["forgotten"]
    saved = store.load_cache(NS, "dedup")
    assert saved is not None and "小白" not in saved[1]("keys.json").decode()


def test_the_keys_of_a_text_are_what_the_scan_reads() -> None:
    k = _keys_of("我的猫叫小白")
    assert (
        k.grams == _grams("我的猫叫小白")
        and "s:猫" in k.keys
        and k.norm == similarity.normalise("我的猫叫小白")
    )


def test_reading_a_namespace_leaves_the_cycle_collector_as_it_found_it(data_dir: Path) -> None:
    """The collector is paused while a book is read in bulk, never left off: a long-running worker with it
    off would keep every reference cycle it ever made."""
    Writer(Store(data_dir)).submit(NS, [Remember(f"我养了第{i}只猫") for i in range(20)])
    assert gc.isenabled()
    Writer(Store(data_dir)).submit(NS, [Remember("我喜欢喝龙井")])  # a fresh process's first read
    assert gc.isenabled()
    gc.disable()
    try:
        Writer(Store(data_dir)).submit(NS, [Remember("我喜欢爬山")])
        assert not gc.isenabled()  # the caller's choice stands
    finally:
        gc.enable()


def test_keys_saved_before_a_forget_are_deleted_with_its_files_even_unreadable(data_dir: Path) -> None:
    """The dedup keys saved before a forget hold its text: the forget deletes them with its files, here
    even a cache no reader can use (its manifest's place taken by a folder), and the keys saved after hold
    no forgotten text; the next writer's index is right."""
    store = Store(data_dir)
    texts = [f"我的第{i}个爱好是收集{i}号邮票" for i in range(300)] + ["我的猫叫小白"]
    Writer(store, clock=lambda: T0).submit(NS, [Remember(text=t) for t in texts])
    writer = Writer(store, clock=lambda: T0)
    writer.submit(NS, [Remember(text="我喜欢喝乌龙茶")])  # a cold read of 301 texts: it saves their keys
    saved = store.load_cache(NS, "dedup")
    assert saved is not None and "小白" in saved[1]("keys.json").decode()
    index = store.path(NS) / ".index"
    (index / "dedup" / "manifest.json").unlink()
    (index / "dedup" / "manifest.json").mkdir()
    assert store.load_cache(NS, "dedup") is None  # unreadable: no cache, not a crash
    cat = next(e for e in writer._books[NS][1].entries() if e.text == "我的猫叫小白")
    assert [o.status for o in writer.submit(NS, [Forget(id=cat.id)])] == ["forgotten"]
    left = [p for p in index.rglob("*") if p.is_file() and "小白" in p.read_text(errors="replace")]
    assert left == [] and not (index / "dedup" / "manifest.json").is_dir()
    again = Writer(store, clock=lambda: T0).submit(NS, [Remember(text="我喜欢喝乌龙茶")])
    assert [o.status for o in again] == ["unchanged"]  # no keys on disk: the index comes from the files
