"""PROFILE.md is about the user only: statements about other people are excluded by what they say, not
only by a `person:` tag, and a profile line that gives the user a third party's attribute is refused."""

from __future__ import annotations

from tests.fakes.ollama import FakeOllama
from tests.trust._history_helpers import Lucid, at, fact, fake_fixture, lucid_fixture  # noqa: F401


def profile_run(lucid: Lucid, fake: FakeOllama, facts: list[tuple[str, str]], reply: str) -> str:
    lucid.import_lines([fact(i, t, at=at(-3)) for i, t in facts])
    fake.script(reply)
    return lucid.with_model(fake).ok("dream", "--phase", "profile").out


def prompt(fake: FakeOllama) -> str:
    return "\n".join(m["content"] for m in fake.last_chat["messages"])


class TestProfileExcludesOthers:
    def test_an_untagged_colleagues_title_never_becomes_the_users(
        self, lucid: Lucid, fake: FakeOllama
    ) -> None:
        out = profile_run(
            lucid,
            fake,
            [("a", "李雷是我们的技术总监"), ("b", "我住在杭州")],
            "- 用户是技术总监\n- 用户住在杭州",
        )
        assert "李雷" not in prompt(fake)  # the model never saw the colleague's statement
        assert "third_party" in out and lucid.read("PROFILE.md") == ""

    def test_the_users_own_title_is_kept_even_when_a_colleague_has_one(
        self, lucid: Lucid, fake: FakeOllama
    ) -> None:
        profile_run(lucid, fake, [("a", "李雷是我们的产品总监"), ("b", "我是技术总监")], "- 用户是技术总监")
        assert "用户是技术总监" in lucid.read("PROFILE.md")

    def test_english_colleague_role_is_not_the_users(self, lucid: Lucid, fake: FakeOllama) -> None:
        out = profile_run(
            lucid, fake, [("a", "Li Lei is our CTO"), ("b", "I live in Paris")], "- The user is the CTO"
        )
        assert "Li Lei" not in prompt(fake)
        assert "third_party" in out and lucid.read("PROFILE.md") == ""

    def test_a_line_about_someone_else_is_refused(self, lucid: Lucid, fake: FakeOllama) -> None:
        out = profile_run(lucid, fake, [("b", "我住在杭州")], "- 用户住在杭州\n- 李雷是技术总监")
        assert "third_party" in out and lucid.read("PROFILE.md") == ""

    def test_pronouns_and_relatives_are_not_profile_inputs(self, lucid: Lucid, fake: FakeOllama) -> None:
        profile_run(
            lucid,
            fake,
            [("a", "他喜欢打篮球"), ("b", "My wife loves jazz"), ("c", "我喜欢爬山"), ("d", "I love tea")],
            "- 用户喜欢爬山\n- Loves tea",
        )
        sent = prompt(fake)
        assert "篮球" not in sent and "jazz" not in sent and "爬山" in sent and "tea" in sent
        profile = lucid.read("PROFILE.md")
        assert "用户喜欢爬山" in profile and "jazz" not in profile and "篮球" not in profile

    def test_a_tagged_third_party_stays_out(self, lucid: Lucid, fake: FakeOllama) -> None:
        lucid.import_lines([fact("p", "张三住在北京", subject="person:张三", at=at(-3))])
        out = profile_run(lucid, fake, [("b", "我住在上海")], "- 用户住在北京")
        assert "张三" not in prompt(fake) and "rejected" in out and lucid.read("PROFILE.md") == ""
