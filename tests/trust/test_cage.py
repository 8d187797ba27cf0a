"""The deep-dream cage checks content, not only numbers: every place, proper noun, qualifier and quantity of
the sources survives a merge, or the merge is rejected, counted and reported with its reason."""

from __future__ import annotations

import json

import pytest

from memory_core.dream_deep import Rejection, validate_merge
from memory_core.entry import Entry
from tests.fakes.ollama import FakeOllama, HttpError
from tests.trust._history_helpers import Lucid, at, fact, fake_fixture, lucid_fixture  # noqa: F401


def verdict(sources: list[str], merged: str) -> str:
    entries = [Entry(id=f"s{i}", text=t) for i, t in enumerate(sources)]
    op = {"ids": [e.id for e in entries], "text": merged}
    result = validate_merge(entries, op, [e.id for e in entries])
    return f"{result.reason}: {result.detail}" if isinstance(result, Rejection) else "accepted"


class TestCageKeepsContent:
    @pytest.mark.parametrize(
        ("sources", "merged", "lost"),
        [
            (["服务部署在 AWS 东京区域", "服务部署在 AWS"], "服务部署在 AWS", "东京区域"),
            (["我住在杭州西湖区", "我住在杭州"], "我住在杭州", "西湖区"),
            (["我有两个孩子", "我有孩子，都在上小学"], "我有孩子，都在上小学", "两个"),
            (["我每周三去健身房", "我去健身房练腿"], "我去健身房练腿", "每周三"),
            (["我只在周末喝咖啡", "我喝咖啡不加糖"], "我喝咖啡不加糖", "周末"),
            (["公司总部在上海浦东新区", "公司总部在上海"], "公司总部在上海", "浦东新区"),
            (["I only drink coffee on weekends", "I drink coffee black"], "I drink coffee black", "weekends"),
            (["I live in the west of Berlin", "I live in Berlin"], "I live in Berlin", "west"),
            (["I have two cats", "I have cats at home"], "I have cats at home", "two"),
            (["The API runs on AWS in Tokyo", "The API runs on AWS"], "The API runs on AWS", "tokyo"),
        ],
    )
    def test_a_merge_that_drops_content_is_rejected_and_says_what(
        self, sources: list[str], merged: str, lost: str
    ) -> None:
        got = verdict(sources, merged)
        assert got.startswith("missing_term:") and lost in got

    @pytest.mark.parametrize(
        ("sources", "merged"),
        [
            (["我住在杭州西湖区", "我住在杭州"], "我住在杭州西湖区"),
            (["服务部署在 AWS 东京区域", "服务部署在 AWS"], "服务部署在 AWS 东京区域"),
            (["I drink coffee", "I drink coffee every morning"], "I drink coffee every morning"),
        ],
    )
    def test_a_faithful_merge_is_accepted(self, sources: list[str], merged: str) -> None:
        assert verdict(sources, merged) == "accepted"

    def test_a_place_no_source_names_is_invented(self) -> None:
        got = verdict(["我住在杭州", "我住在杭州，离公司很近"], "我住在杭州滨江区，离公司很近")
        assert got.startswith("invented:") and "滨江区" in got

    def test_through_lucid_dream_the_lossy_merge_changes_nothing_and_is_reported(
        self, lucid: Lucid, fake: FakeOllama
    ) -> None:
        lucid.import_lines(
            [
                fact("aws1", "服务部署在 AWS 东京区域", subject="部署", at=at(-30)),
                fact("aws2", "服务部署在 AWS", subject="部署", at=at(-30)),
            ]
        )
        fake.script(json.dumps({"merges": [{"ids": ["aws1", "aws2"], "text": "服务部署在 AWS"}]}))
        ran = lucid.with_model(fake).ok("dream", "--phase", "deep")
        assert "rejections: 1 missing_term" in ran.out and "东京区域" in ran.out
        assert sorted(lucid.current_texts()) == ["服务部署在 AWS", "服务部署在 AWS 东京区域"]
        journal = lucid.read("DREAMS.md")
        assert "missing_term 1" in journal  # counted in the journal; its words are not kept there (a forget
        assert "东京区域" not in journal  # of the fact could not reach them): the run's output says them
        assert "服务部署在 AWS 东京区域" in lucid.recall("东京")


def test_a_rejected_profile_line_is_said_to_the_runner_not_kept_in_the_journal(
    lucid: Lucid, fake: FakeOllama
) -> None:
    """DREAMS.md is committed and a forget does not rewrite it, so it keeps ids, counts and reasons only;
    the words a rejection quotes go to whoever ran the dream (found by a privacy review: a profile line
    the guard refused was kept there, quoting the person's facts)."""
    lucid.import_lines(
        [
            fact("p1", "我对花生过敏", type="fact", at=at(-3)),
            fact("p2", "我住在杭州西湖区", type="fact", at=at(-3)),
            fact("p3", "我喜欢爬山", type="preference", at=at(-3)),
        ]
    )
    fake.script("- 对花生过敏\n- 住在杭州西湖区\n- 养了一只叫豆豆的柯基，每天遛狗")
    ran = lucid.with_model(fake).ok("dream", "--phase", "profile")
    assert "profile rejected (unsupported): 养了一只叫豆豆的柯基" in ran.out  # the runner is told what
    journal = lucid.read("DREAMS.md")
    assert "profile rejected (unsupported)" in journal
    assert "豆豆" not in journal and "花生" not in journal


def test_a_failed_model_call_s_text_is_said_not_kept_in_the_journal(lucid: Lucid, fake: FakeOllama) -> None:
    """An error's text can quote what the model or the server read (a 4xx names the input it refused): the
    journal keeps that the call failed and why by class, the runner is told the rest."""
    lucid.import_lines([fact("p1", "我对花生过敏", type="fact", at=at(-3))])
    fake.script(HttpError(400, "cannot parse input near '对花生过敏'"))
    ran = lucid.with_model(fake).ok("dream", "--phase", "profile")
    assert "model call failed: " in ran.out and "花生" in ran.out
    journal = lucid.read("DREAMS.md")
    assert "model call failed (LLMError)" in journal and "花生" not in journal
