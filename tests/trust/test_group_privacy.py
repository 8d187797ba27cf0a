"""Group privacy by default (DESIGN §5): in a group the prompt holds the speaker's instructions about how
to answer and what was learned in that group; identity, preferences, facts, profile and raw archive learned
in private stay private unless the person shares them, and a sensitive one is never shared automatically.

Through the real turn (workers.turn.run_turn) with the real `ollama` client against FakeOllama: what the
model is shown is read from the fake's requests, what a person sees from the replies."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from memory_core.sensitive import is_sensitive
from tests.fakes.ollama import FakeOllama
from tests.trust.turns import (
    entry_id,
    make_runtime,
    memory_file,
    new_session,
    say,
    system_prompt,
    tool,
)
from workers.runtime import Runtime

OLLAMA_REPLY = "好的。"  # what the model answers when a test scripts nothing


@pytest.fixture
def rt(data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama) -> Runtime:
    return make_runtime(data_dir, redis_url, ollama=ollama)


PRIVATE_ZH = ("记住我是糖尿病患者", "记住我喜欢喝美式咖啡", "记住我住在余杭区")
PRIVATE_EN = ("Remember that I have diabetes", "I prefer green tea", "Remember that I live in Berlin")


@pytest.mark.parametrize(
    ("private", "instruction", "learned_here", "question", "leaks"),
    [
        (
            PRIVATE_ZH,
            "以后回答简洁一点",
            "记住我负责前端",
            "我住在哪？我负责什么？",
            ("糖尿病", "美式", "余杭区"),
        ),
        (
            PRIVATE_EN,
            "From now on answer in bullet points",
            "Remember that I lead the frontend team",
            "where do I live? what do I lead? and my diabetes?",
            ("diabetes", "green tea", "Berlin"),
        ),
    ],
)
def test_a_group_prompt_holds_instructions_and_group_learning_only(
    rt: Runtime,
    ollama: FakeOllama,
    private: tuple[str, ...],
    instruction: str,
    learned_here: str,
    question: str,
    leaks: tuple[str, ...],
) -> None:
    for text in (*private, instruction):
        say(rt, text)
    say(rt, learned_here, group=True)
    new_session(rt)

    say(rt, question, group=True)
    group_prompt = system_prompt(ollama)
    listing = say(rt, "/memory", group=True)
    say(rt, question)
    private_prompt = system_prompt(ollama)

    for word in leaks:
        assert word not in group_prompt and word not in listing, word
        assert word in private_prompt, word  # the same memory is shown in private: the read path works
    shown_instruction = instruction.split()[-1] if instruction.isascii() else "简洁"
    learned = learned_here.split()[-2] if learned_here.isascii() else "前端"
    assert shown_instruction in group_prompt and learned in group_prompt  # positive: not an empty prompt
    assert shown_instruction in listing and learned in listing


def test_share_shows_a_private_memory_in_groups_and_unshare_takes_it_back(
    rt: Runtime, ollama: FakeOllama
) -> None:
    say(rt, "记住我喜欢喝美式咖啡")
    ident = entry_id(rt, "美式")
    assert "美式" not in say(rt, "/memory", group=True)

    assert "已分享" in say(rt, f"/share {ident[:8]}")
    new_session(rt)
    say(rt, "我平时喝什么", group=True)
    assert "美式" in system_prompt(ollama) and "美式" in say(rt, "/memory", group=True)
    assert "share=1" in memory_file(rt)

    assert "取消分享" in say(rt, f"/unshare {ident[:8]}")
    assert "美式" not in say(rt, "/memory", group=True)


def test_a_group_cannot_probe_private_memory_by_words(rt: Runtime) -> None:
    say(rt, "记住我喜欢喝美式咖啡")
    answer = say(rt, "/share 美式", group=True)
    assert "美式" not in answer and "share=1" not in memory_file(rt)


def test_unshare_in_a_group_never_quotes_a_memory_the_group_cannot_see(rt: Runtime) -> None:
    """/unshare answers with the entry's text: in a group, for an entry it never saw (here a sensitive
    one said in private), it must answer as if there were no such entry."""
    say(rt, "记住我是糖尿病患者")
    ident = entry_id(rt, "糖尿病")
    answer = say(rt, f"/unshare {ident[:8]}", group=True)
    assert "糖尿病" not in answer and "取消分享" not in answer
    say(rt, "记住我喜欢喝美式咖啡")
    assert "已分享" in say(rt, f"/share {entry_id(rt, '美式')[:8]}")
    assert "美式" in say(rt, f"/unshare {entry_id(rt, '美式')[:8]}", group=True)  # shared there: it sees it


def test_the_model_shares_on_request_but_never_a_sensitive_memory(rt: Runtime, ollama: FakeOllama) -> None:
    say(rt, "记住我喜欢喝美式咖啡")
    say(rt, "记住我是糖尿病患者")
    coffee, health = entry_id(rt, "美式"), entry_id(rt, "糖尿病")
    ollama.script(tool(action="share", target=coffee), tool(action="share", target=health), "好的")
    say(rt, "把我爱喝美式和我的病情都告诉群里吧")
    answers = [m["content"] for m in ollama.chat_requests[-1]["messages"] if m["role"] == "tool"]
    assert '"updated"' in answers[0] and "rejected:sensitive" in answers[1]

    new_session(rt)
    say(rt, "hi team, what do I drink?", group=True)
    assert "美式" in system_prompt(ollama) and "糖尿病" not in system_prompt(ollama)
    # The person's own explicit /share is not an automatic path: it may share what they choose.
    assert "已分享" in say(rt, f"/share {health[:8]}")
    assert "糖尿病" in say(rt, "/memory", group=True)


def test_the_models_add_with_share_flag_honours_the_sensitive_rule(rt: Runtime, ollama: FakeOllama) -> None:
    ollama.script(
        tool(action="add", text="I love hiking on weekends", type="preference", share=True),
        tool(action="add", text="My salary is 30k a month", type="fact", share=True),
        "ok",
    )
    say(rt, "Tell my groups I love hiking; and my salary too")
    new_session(rt)
    say(rt, "what do I like?", group=True)
    group_prompt = system_prompt(ollama)
    assert "hiking" in group_prompt and "salary" not in group_prompt


def test_a_sensitive_instruction_stays_private(rt: Runtime, ollama: FakeOllama) -> None:
    say(rt, "以后回答简洁一点")
    say(rt, "以后别在回答里提我的糖尿病")
    new_session(rt)
    say(rt, "帮我看看这个方案", group=True)
    assert "简洁" in system_prompt(ollama) and "糖尿病" not in system_prompt(ollama)
    say(rt, "帮我看看这个方案")
    assert "糖尿病" in system_prompt(ollama)


@pytest.mark.parametrize(
    ("in_group", "in_private", "private_words"),
    [
        ("我在字节跳动工作", "我在字节跳动工作，年薪80万，正在偷偷找下家", "年薪80万"),
        ("记住我喜欢爬山", "记住我喜欢爬山，每周六早上一个人去九溪", "九溪"),
    ],
)
def test_a_fuller_wording_said_in_private_never_reaches_the_group_that_heard_the_short_one(
    rt: Runtime, ollama: FakeOllama, in_group: str, in_private: str, private_words: str
) -> None:
    """Found by a privacy review: the private wording was taken as the same meaning and updated the group's
    line in place, keeping its group scope, so the salary was in that group's prompt and `/memory`."""
    say(rt, in_group, group=True)
    say(rt, in_private)
    new_session(rt)
    say(rt, "我在哪工作？我喜欢什么？", group=True)
    group_prompt, listing = system_prompt(ollama), say(rt, "/memory", group=True)
    assert private_words not in group_prompt and private_words not in listing
    short = in_group.removeprefix("记住")
    assert short in group_prompt  # the group keeps what it was told
    say(rt, "我在哪工作？我喜欢什么？")
    assert private_words in system_prompt(ollama)  # and the private chat has the fuller wording


def test_a_shared_memory_reworded_in_private_shares_only_what_was_shared(
    rt: Runtime, ollama: FakeOllama
) -> None:
    say(rt, "记住我喜欢喝咖啡")
    say(rt, f"/share {entry_id(rt, '咖啡')[:8]}")
    say(rt, "记住我喜欢喝咖啡，因为失眠每天只敢喝一杯")
    new_session(rt)
    say(rt, "我喜欢喝什么？", group=True)
    assert "喝咖啡" in system_prompt(ollama) and "失眠" not in system_prompt(ollama)


def test_the_model_rewriting_a_group_memory_in_private_moves_it_out_of_the_group(
    rt: Runtime, ollama: FakeOllama
) -> None:
    say(rt, "记住我在字节跳动工作", group=True)
    ident = entry_id(rt, "字节跳动")
    ollama.script(tool(action="update", target=ident, text="我在字节跳动工作，年薪80万"), "好的")
    say(rt, "帮我把工作那条记忆补上年薪80万")
    assert "年薪80万" in memory_file(rt)
    new_session(rt)
    say(rt, "我在哪工作？", group=True)
    assert "年薪" not in system_prompt(ollama) and "年薪" not in say(rt, "/memory", group=True)


def test_unshare_takes_a_memory_out_of_the_running_group_session(rt: Runtime, ollama: FakeOllama) -> None:
    """Found by a privacy review: the group's resident tier is frozen per session by id, and was re-read
    without asking again whether the group may see each entry: an unshared memory (or one rewritten in
    private) stayed in the group's prompt until the session ended."""
    say(rt, "记住我喜欢喝美式咖啡")
    ident = entry_id(rt, "美式")
    assert "已分享" in say(rt, f"/share {ident[:8]}")
    say(rt, "我平时喝什么", group=True)  # the group's session starts: the shared entry is resident there
    assert "美式" in system_prompt(ollama)

    assert "取消分享" in say(rt, f"/unshare {ident[:8]}")
    assert "share=1" not in memory_file(rt)
    assert "美式" not in say(rt, "/memory", group=True)  # the listing knows it is private again
    say(rt, "大家下午好", group=True)  # same group session, a minute later
    assert "美式" not in system_prompt(ollama), "an unshared (private) memory is still in the group's prompt"


def test_a_group_memory_rewritten_in_private_leaves_the_group_session(
    rt: Runtime, ollama: FakeOllama
) -> None:
    say(rt, "记住我喜欢爬山", group=True)  # a preference learned in the group: resident there
    ident = entry_id(rt, "爬山")
    assert "scope=g%3A" in memory_file(rt) or "scope=g:" in memory_file(rt)
    new_session(rt)
    say(rt, "周末有什么安排", group=True)  # a new group session: the entry is in its frozen resident tier
    assert "- 我喜欢爬山" in system_prompt(ollama).split("## Standing memory")[1]

    # in private, the model rewords it with more (private) detail: the entry moves to the private chat
    ollama.script(tool(action="update", target=ident, text="我喜欢爬山，每周和前女友小美一起去"), "好的")
    say(rt, "其实我喜欢爬山是因为每周和前女友小美一起去")
    line = next(line for line in memory_file(rt).splitlines() if "小美" in line)
    assert f"id={ident}" in line and "scope=g" not in line  # same id, now private
    assert "小美" not in say(rt, "/memory", group=True)  # the listing knows it is private now

    say(rt, "周末有什么安排", group=True)  # same group session
    assert "小美" not in system_prompt(ollama), "a private rewording reached the group's prompt"


def test_a_shared_memory_rewritten_with_a_health_detail_stays_out_of_groups(
    rt: Runtime, ollama: FakeOllama
) -> None:
    """Found by a privacy review: a shared memory the model rewrote in private kept its share, so a health
    detail said in private reached every group. The person shared their words; the model's are not."""
    say(rt, "记住我喜欢喝美式咖啡")
    ident = entry_id(rt, "美式")
    assert "已分享" in say(rt, f"/share {ident[:8]}")  # the person shares a harmless preference

    private = "我喜欢喝美式咖啡，医生说对我的抑郁症有帮助"
    assert is_sensitive(private)
    ollama.script(tool(action="update", target=ident, text=private), "好的")
    say(rt, "其实我喝美式是因为医生说对我的抑郁症有帮助")  # said in private; the model rewrites the memory
    assert "抑郁症" in memory_file(rt)

    new_session(rt)
    say(rt, "大家推荐点喝的", group=True)
    listing = say(rt, "/memory", group=True)
    assert "抑郁症" not in system_prompt(ollama), "a private health detail reached the group's prompt"
    assert "抑郁症" not in listing, "a private health detail is listed in the group"
    say(rt, "记住我喜欢喝拿铁")
    assert "已分享" in say(rt, f"/share {entry_id(rt, '拿铁')[:8]}")  # positive control: a share still shows
    new_session(rt)
    say(rt, "大家推荐点喝的", group=True)
    assert "拿铁" in system_prompt(ollama)
