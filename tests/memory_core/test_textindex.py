"""Tokenizer and BM25 behaviour: what a user searching Chinese, English or mixed memories would notice,
and a cross-check of the index against rank_bm25 itself."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from memory_core.textindex import (
    BM25Index,
    entry_relevance,
    minmax,
    normalised,
    tokenize,
    top_slots,
)

TEA = ["她每天下午喝一杯乌龙茶", "用户不喝茶", "我在西湖区", "I drink coffee every morning"]


def build(texts: list[str], **params: Any) -> BM25Index:
    index = BM25Index(**params)
    for i, text in enumerate(texts):
        index.add(i, Counter(tokenize(text)))
    return index


def found(index: BM25Index, query: str, k: int = 10) -> list[object]:
    return [key for key, _ in index.top(tokenize(query), k)]


def test_single_character_query_finds_the_compound_word() -> None:
    assert set(found(build(TEA), "茶")) == {0, 1}


def test_two_character_query_finds_its_bigram_first() -> None:
    assert found(build(TEA), "乌龙") == [0]
    assert found(build(TEA), "乌龙茶")[0] == 0


def test_stop_characters_are_removed_before_forming_ngrams() -> None:
    assert tokenize("我的猫") == ["猫"]
    # 不 and 了 go, and the bigram bridges the gap they leave.
    assert tokenize("喝了茶") == ["喝", "茶", "喝茶"]


def test_english_words_are_stemmed_so_plurals_and_verb_forms_meet() -> None:
    index = build(["Caroline adopted two dogs", "Melanie runs a marathon", "Nothing related here at all"])
    assert found(index, "adoption of a dog") == [0]
    assert found(index, "running") == [1]
    assert tokenize("The Stores") == ["store"]


def test_english_stop_words_never_count_as_evidence() -> None:
    index = build(["what is this", "the answer is here"])
    assert found(index, "What is the") == []


def test_mixed_chinese_english_text_meets_a_mixed_query() -> None:
    index = build(["我用Python写Redis脚本", "今天吃了面条", "Python is fun"])
    assert found(index, "redis 脚本")[0] == 0
    assert "python" in tokenize("用Python")


def test_full_width_and_accented_latin_fold_to_plain_ascii() -> None:
    assert tokenize("ＡＢＣ１２３") == tokenize("abc123")
    assert tokenize("Café") == tokenize("cafe")


def test_other_scripts_are_kept_as_whole_words() -> None:
    assert tokenize("Привет мир") == ["привет", "мир"]


def test_a_matching_term_stays_evidence_where_rank_bm25_idf_would_be_zero_or_negative() -> None:
    # 茶 is in 2 of 4 entries (rank_bm25 idf exactly 0); apple is in every document (negative mean idf).
    assert BM25Index(min_idf=None).idf("x") == 0.0
    exact = build(TEA, min_idf=None)
    assert exact.top(tokenize("茶"), 5) == []
    assert found(build(["apple pie", "apple tart"]), "apple") == [0, 1]


@settings(max_examples=100, deadline=None)
@given(corpus=st.lists(st.lists(st.sampled_from("abcdefgh"), max_size=6), min_size=1, max_size=12))
def test_the_idf_floor_changes_only_terms_rank_bm25_scores_at_or_below_it(corpus: list[list[str]]) -> None:
    exact, floored = BM25Index(min_idf=None), BM25Index()
    for i, doc in enumerate(corpus):
        exact.add(i, Counter(doc))
        floored.add(i, Counter(doc))
    for term in "abcdefgh":
        if term in {t for doc in corpus for t in doc}:
            assert floored.idf(term) == max(exact.idf(term), 1e-3)


def test_a_query_without_evidence_returns_nothing() -> None:
    index = build(TEA)
    assert index.top(tokenize("火星探测器"), 5) == []
    assert index.top([], 5) == []
    assert entry_relevance("火星探测器", TEA) == [0.0, 0.0, 0.0, 0.0]


def test_remove_takes_a_document_out_of_results_and_statistics() -> None:
    index = build(TEA)
    index.remove(0)
    assert 0 not in index and len(index) == 3
    assert found(index, "茶") == [1]
    with pytest.raises(KeyError):
        index.remove(0)


def test_update_replaces_a_bag_in_place() -> None:
    index = build(TEA)
    index.update(2, Counter(tokenize("我搬到了滨江区")))
    assert found(index, "西湖") == []
    assert found(index, "滨江") == [2]


def test_adding_the_same_key_twice_is_refused() -> None:
    index = build(TEA)
    with pytest.raises(KeyError):
        index.add(0, {"x": 1.0})


def test_negative_or_nan_weights_are_refused() -> None:
    index = BM25Index()
    with pytest.raises(ValueError):
        index.add("a", {"x": -1.0})
    with pytest.raises(ValueError):
        index.add("b", {"x": float("nan")})


def test_ties_go_to_the_earlier_document() -> None:
    index = build(["apple pie", "apple tart", "apple cake"])
    assert found(index, "apple") == [0, 1, 2]
    assert top_slots(np.array([0.0, 2.0, 2.0, 1.0, 2.0]), 2).tolist() == [1, 2]


def test_normalised_relevance_keeps_zero_and_tops_out_at_one() -> None:
    assert normalised([0.0, 2.0, 4.0]).tolist() == [0.0, 0.5, 1.0]
    assert normalised([0.0, 0.0]).tolist() == [0.0, 0.0]
    assert normalised([]).size == 0
    rel = entry_relevance("乌龙茶", TEA)
    assert max(rel) == 1.0 and rel[2] == 0.0 and rel[3] == 0.0


def test_vectors_mix_into_entry_relevance() -> None:
    texts = ["喜欢喝茶", "明天下雨", "去杭州旅游"]
    vectors = np.eye(3)
    rel = entry_relevance("茶", texts, query_vector=[0.0, 0.0, 1.0], entry_vectors=vectors, dense_weight=0.7)
    assert rel[0] == pytest.approx(0.3) and rel[2] == pytest.approx(0.7) and rel[1] == 0.0
    assert minmax([3.0, 3.0]).tolist() == [1.0, 1.0]


@settings(max_examples=300, deadline=None)
@given(
    st.text(st.characters(exclude_categories=[]))
    | st.text(st.sampled_from("乌龙茶的了a Z9é\u3042한\ud800-_"))
)
def test_tokenize_never_raises_and_emits_no_empty_tokens(text: str) -> None:
    tokens = tokenize(text)
    assert all(tokens) and all(isinstance(t, str) for t in tokens)


# ----------------------------------------------------------------------------- cross-check with rank_bm25

WORDS = st.lists(st.sampled_from("abcdefgh"), max_size=6)


def assert_matches_rank_bm25(index: BM25Index, live: dict[int, list[str]], query: list[str]) -> None:
    keys = sorted(live)
    if not keys or not any(live[k] for k in keys):
        return  # rank_bm25 divides by a zero average length there
    assert index.min_idf is None, "compare against the exact rank_bm25 convention"
    reference = BM25Okapi([live[k] for k in keys], k1=index.k1, b=index.b, epsilon=index.epsilon).get_scores(
        query
    )
    got = index.score_array(query)
    mine = np.array([got[index.slot_of(k)] for k in keys])
    np.testing.assert_allclose(mine, reference, rtol=1e-6, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    corpus=st.lists(WORDS, min_size=1, max_size=12),
    query=st.lists(st.sampled_from("abcdefghi"), min_size=1, max_size=5),
    k1=st.sampled_from([0.9, 1.2, 1.5]),
    b=st.sampled_from([0.3, 0.5, 0.75]),
)
def test_scores_equal_rank_bm25_on_random_corpora(
    corpus: list[list[str]], query: list[str], k1: float, b: float
) -> None:
    index = BM25Index(k1=k1, b=b, min_idf=None)
    for i, doc in enumerate(corpus):
        index.add(i, Counter(doc))
    assert_matches_rank_bm25(index, dict(enumerate(corpus)), query)


@settings(max_examples=150, deadline=None)
@given(
    corpus=st.lists(WORDS, min_size=1, max_size=10),
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "update", "remove"]), st.integers(0, 14), WORDS), max_size=25
    ),
    query=st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=5),
)
def test_scores_after_adds_updates_and_removes_equal_a_fresh_rank_bm25(
    corpus: list[list[str]], ops: list[tuple[str, int, list[str]]], query: list[str]
) -> None:
    index = BM25Index(min_idf=None)
    live: dict[int, list[str]] = {}
    for i, doc in enumerate(corpus):
        index.add(i, Counter(doc))
        live[i] = doc
    for op, key, doc in ops:
        if op == "add" and key not in live:
            index.add(key, Counter(doc))
            live[key] = doc
        elif op == "update" and key in live:
            index.update(key, Counter(doc))
            live[key] = doc
        elif op == "remove" and key in live:
            index.remove(key)
            del live[key]
    assert len(index) == len(live)
    assert index.problems() == []
    assert_matches_rank_bm25(index, live, query)


@settings(max_examples=100, deadline=None)
@given(
    corpus=st.lists(WORDS, min_size=1, max_size=12), query=st.lists(st.sampled_from("abcdefgh"), max_size=5)
)
def test_bulk_insert_and_array_round_trip_score_like_single_adds(
    corpus: list[list[str]], query: list[str]
) -> None:
    single = BM25Index(k1=0.9, b=0.5)
    bulk = BM25Index(k1=0.9, b=0.5)
    rows = [(d, bulk.term_id(t), float(c)) for d, doc in enumerate(corpus) for t, c in Counter(doc).items()]
    for i, doc in enumerate(corpus):
        single.add(i, Counter(doc))
    bulk.add_flat(
        list(range(len(corpus))),
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.int64),
        np.array([r[2] for r in rows], dtype=np.float64),
    )
    restored = BM25Index.from_arrays(bulk.terms, list(range(len(corpus))), bulk.export_arrays())
    expected = single.score_array(query)
    np.testing.assert_allclose(bulk.score_array(query), expected)
    np.testing.assert_allclose(restored.score_array(query), expected)
    # The restored index stays writable: positions were rebuilt.
    restored.remove(0)
    single.remove(0)
    np.testing.assert_allclose(restored.score_array(query), single.score_array(query))
    assert bulk.problems() == [] and restored.problems() == []


def test_bulk_insert_refuses_a_document_indexed_twice_and_changes_nothing() -> None:
    index = BM25Index()
    index.add("a", Counter(["x", "y"]))
    before = index.score_array(["x", "y"]).tolist()
    one = np.zeros(1, dtype=np.int64)
    for keys in (["a"], ["b", "b"]):
        with pytest.raises(KeyError):
            index.add_flat(
                keys, np.zeros(len(keys), dtype=np.int64), one.repeat(len(keys)), np.ones(len(keys))
            )
        assert len(index) == 1 and index.slot_of("b") is None
        assert index.score_array(["x", "y"]).tolist() == before and index.problems() == []


def test_term_ids_intern_new_terms_once_and_agree_with_term_id() -> None:
    index = BM25Index()
    known = index.term_id("x")
    ids = index.term_ids(["y", "x", "y", "z"]).tolist()
    assert ids[1] == known and ids[0] == ids[2] and len(set(ids)) == 3
    assert [index.term_id(t) for t in ("y", "x", "y", "z")] == ids
    assert index.vocabulary_size == 3


@pytest.mark.parametrize("way", ["add", "add_flat", "from_arrays"])
def test_an_indexed_document_gives_the_cycle_collector_nothing_to_walk(way: str) -> None:
    """A worker keeps every namespace it read indexed, and each full collection of Python's cycle collector
    walks every object it tracks while the process stands still. Documents are the many (a raw archive
    holds hundreds of thousands of messages); terms are few. So a document's columns must be untracked:
    the collector's objects grow with the vocabulary, not with the documents."""
    import gc

    rng = np.random.default_rng(3)
    docs = [Counter(f"w{t}" for t in rng.integers(0, 300, 12)) for _ in range(3000)]
    gc.collect()
    before = len(gc.get_objects())
    index = BM25Index()
    if way == "add":
        for i, doc in enumerate(docs):
            index.add(i, doc)
    else:
        rows = [(d, index.term_id(t), float(c)) for d, doc in enumerate(docs) for t, c in doc.items()]
        index.add_flat(list(range(len(docs))), *(np.array(col) for col in zip(*rows, strict=True)))
        if way == "from_arrays":
            index = BM25Index.from_arrays(index.terms, list(range(len(docs))), index.export_arrays())
    gc.collect()
    tracked = len(gc.get_objects()) - before
    assert tracked < 3 * index.vocabulary_size + 100 < len(docs), (tracked, index.vocabulary_size)
    # and the index still works: updates move postings inside the documents' columns
    index.update(0, Counter(["w1", "new"]))
    index.remove(1)
    assert index.problems() == [] and index.top(["new"], 1)[0][0] == 0
