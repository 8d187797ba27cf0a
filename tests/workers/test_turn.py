"""The turn: memory-only mode, the model with its `manage_memory` tool, commands, scope and ordering.

Real Redis, real files, the real `ollama` client against FakeOllama. The model's tool calls go through
the same writer as everything else, so these tests read MEMORY.md to see what a person would see.
"""

from __future__ import annotations

import argparse
import io
import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue

from bot import chat_cli
from memory_core.namespace import Namespace
from memory_core.ops import Remember
from tests.fakes.ollama import Delay, FakeOllama
from workers.feishu_send import FeishuError
from workers.inbound import Inbound, TurnLimits
from workers.llm import LLM
from workers.mailbox import Intake, Mailbox
from workers.queues import fetch, queue
from workers.runtime import Runtime, TurnTime, build
from workers.settings import Persona, Settings
from workers.turn import MAX_REPLY_CHARS, run_turn

MODEL = "qwen3:4b"
GROUP = "oc_team_group"
_clock = itertools.count(1)


@pytest.fixture
def ollama() -> Iterator[FakeOllama]:
    with FakeOllama() as fake:
        yield fake


def make_runtime(
    data_dir: Path, redis_url: str | None, *, ollama: FakeOllama | None = None, admins: tuple[str, ...] = ()
) -> Runtime:
    personas = {name: Persona(name, admins=admins) for name in ("default", "other")}
    settings = Settings(data_dir=data_dir, personas=personas, chat_model=MODEL if ollama else None)
    runtime = build(settings, redis_url, git=False)
    # A short model timeout and no retry: a slow or dead Ollama must cost the turn at most ~1 s here.
    return replace(runtime, llm=LLM(ollama.url, timeout=1.0, retries=0) if ollama else None)


@pytest.fixture
def rt(data_dir: Path, redis_url: str, redis_client: redis.Redis) -> Runtime:
    return make_runtime(data_dir, redis_url)


def msg(
    text: str, user: str = "alice", *, persona: str = "default", group: bool = False, open_id: str = ""
) -> Inbound:
    return Inbound(
        tenant="t1", user=user, open_id=open_id or f"ou_{user}", persona=persona,
        chat_id=GROUP if group else f"oc_p2p_{user}", chat_type="group" if group else "p2p",
        message_id=f"om_{uuid.uuid4().hex}", text=text, mentioned_bot=group,
        create_time=int(time.time() * 1000) + next(_clock),
    )  # fmt: skip


def say(runtime: Runtime, text: str, **kw: Any) -> str:
    replies: list[str] = []
    run_turn(runtime, msg(text, **kw), replies.append)
    assert len(replies) == 1
    return replies[0]


def memory_file(runtime: Runtime, user: str = "alice", persona: str = "default") -> str:
    return (runtime.store.path(Namespace.of("t1", user, persona)) / "MEMORY.md").read_text()


# ------------------------------------------------------------------------------------------- memory-only


def test_the_seed_story_without_a_model(rt: Runtime) -> None:
    say(rt, "我住在余杭区")
    update = say(rt, "我现在在西湖区")
    answer = say(rt, "我在哪")

    assert "西湖区" in update
    assert "西湖区" in answer and "余杭区" not in answer
    assert "没有配置对话模型" in answer  # says plainly why it is terse
    lines = {line.split(" <!--")[0]: line for line in memory_file(rt).splitlines() if line.startswith("- ")}
    assert "vt=" in lines["- ~~我住在余杭区~~"] and "sup=" in lines["- 我现在在西湖区"]


def test_explicit_requests_are_handled_deterministically(rt: Runtime) -> None:
    assert "我记住了" in say(rt, "记住我对花生过敏")
    assert "以后回答都用中文" not in memory_file(rt)
    assert "我记住了" in say(rt, "以后回答都用中文")
    assert "- 以后回答都用中文 <!--m:" in memory_file(rt) and "t=instruction" in memory_file(rt)
    assert "密码" in say(rt, "记住我的密码是 Xk9#mQ2$vL8pR4wZ") and "Xk9#" not in memory_file(rt)
    assert "已忘掉" in say(rt, "忘掉我对花生过敏")
    assert "花生" not in memory_file(rt)
    assert "Hi" in say(rt, "hello") and "No chat model" in say(rt, "where do I live?")


def test_forget_never_guesses_between_several_memories(rt: Runtime) -> None:
    say(rt, "记住我喜欢喝咖啡")
    say(rt, "记住我不喜欢咖啡因太高的咖啡")
    ask = say(rt, "/forget 咖啡")
    assert "哪一条" in ask and memory_file(rt).count("咖啡") >= 2
    short_id = ask.splitlines()[1][3:11]
    assert "已忘掉" in say(rt, f"/forget {short_id}")


def test_commands_and_their_chinese_aliases(rt: Runtime) -> None:
    say(rt, "我叫小明")
    assert "小明" in say(rt, "/memory") and "小明" in say(rt, "记忆")
    assert "/memory" in say(rt, "帮助") and "/dream" not in say(rt, "/help")
    assert "对话模型：未配置（仅记忆模式）" in say(rt, "/persona")  # after Chinese messages: in Chinese
    assert "chat model: none (memory-only mode)" in say(rt, "/persona please")  # asked in English
    assert "ou_alice" in say(rt, "/whoami")


def test_admin_commands_fail_closed(data_dir: Path, redis_url: str, redis_client: redis.Redis) -> None:
    nobody = make_runtime(data_dir, redis_url)
    assert "管理员" in say(nobody, "/stats") and "管理员" in say(nobody, "做梦 deep")
    admin = make_runtime(data_dir, redis_url, admins=("ou_boss",))
    assert "管理员" in say(admin, "/stats", open_id="ou_intern")
    assert '"queues"' in say(admin, "/stats", open_id="ou_boss")
    assert "/dream" in say(admin, "/help", open_id="ou_boss")
    assert "light" in say(admin, "/dream", open_id="ou_boss") and "deep" in say(
        admin, "做梦 deep", open_id="ou_boss"
    )
    assert len(Queue("dream", connection=admin.redis)) == 2


# ------------------------------------------------------------------------------------------- scope


def test_private_facts_never_reach_a_group_and_group_learning_stays_there(rt: Runtime) -> None:
    say(rt, "我住在余杭区")
    in_group = say(rt, "我在哪", group=True)
    learned = say(rt, "记住我负责前端", group=True)
    group_list = say(rt, "/memory", group=True)
    private_list = say(rt, "/memory")

    assert "余杭区" not in in_group and "余杭区" not in group_list
    assert "我记住了" in learned and "负责前端" in group_list
    assert "余杭区" in private_list and "负责前端" in private_list
    assert f"scope=g:{GROUP}" in memory_file(rt)


def test_people_and_personas_are_isolated(rt: Runtime) -> None:
    say(rt, "我住在余杭区", user="alice")
    assert "余杭区" not in say(rt, "我在哪", user="bob")
    assert "余杭区" not in say(rt, "/memory", user="bob")
    assert "余杭区" not in say(rt, "我在哪", user="alice", persona="other")


# ------------------------------------------------------------------------------------------- the model


def _tool(**arguments: Any) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"function": {"name": "manage_memory", "arguments": arguments}}]}


def test_the_model_saves_through_its_tool_and_sees_memory_next_time(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = make_runtime(data_dir, redis_url, ollama=ollama)
    ollama.script(
        _tool(action="add", text="我喜欢喝美式咖啡", type="preference"), "好的，记住了！", "你喜欢美式咖啡。"
    )

    first = say(rt, "我平时喜欢喝美式")
    second = say(rt, "我喜欢喝什么")

    assert (first, second) == ("好的，记住了！", "你喜欢美式咖啡。")
    assert "我喜欢喝美式咖啡" in memory_file(rt) and "src=tool" in memory_file(rt)
    tool_answer = ollama.chat_requests[1]["messages"][-1]
    assert tool_answer["role"] == "tool" and '"added"' in tool_answer["content"]
    system = ollama.chat_requests[2]["messages"][0]["content"]
    assert "我喜欢喝美式咖啡" in system and "memory-context" in system
    assert ollama.chat_requests[2]["messages"][1:3] == [
        {"role": "user", "content": "我平时喜欢喝美式"},
        {"role": "assistant", "content": "好的，记住了！"},
    ]


def test_a_model_that_does_not_stop_cannot_flood_the_chat(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    """Found by a hostile review: a 2,000,000-character answer was sent whole (~670 Feishu messages against
    the app's quota). The model is asked to stop (`num_predict`) and what comes past the cap is not sent."""
    rt = make_runtime(data_dir, redis_url, ollama=ollama)
    ollama.script("好" * 2_000_000)
    reply = say(rt, "写一篇很长的文章")
    assert reply == "好" * MAX_REPLY_CHARS
    assert ollama.chat_requests[-1]["options"]["num_predict"] == MAX_REPLY_CHARS


def test_recall_follows_the_conversation_not_only_the_last_message(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = make_runtime(data_dir, redis_url, ollama=ollama)
    facts = [Remember(text="去年圣诞晚会上我跳了一支舞"), Remember(text="我养了一只叫豆豆的猫")]
    for user in ("alice", "bob"):
        rt.writer.submit(Namespace.of("t1", user, "default"), facts)
    ollama.script("太棒了！豆豆也会为你骄傲的。", "深呼吸，你去年跳舞就很成功。", "别担心，慢慢来。")

    say(rt, "元旦晚会我要表演魔术")
    say(rt, "我有点紧张，该怎么办")  # names nothing remembered: the turn before it does
    say(rt, "我有点紧张，该怎么办", user="bob")  # the same words with no conversation before them

    alice, bob = (r["messages"][0]["content"] for r in ollama.chat_requests[1:3])
    assert "去年圣诞晚会上我跳了一支舞" in alice
    # What the bot said is not what the talk is about: its reply (豆豆) steers nothing.
    assert "去年圣诞晚会上我跳了一支舞" not in bob and "豆豆" not in alice + bob


def test_tool_calls_are_validated_and_secrets_never_stored(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = make_runtime(data_dir, redis_url, ollama=ollama)
    ollama.script(
        _tool(action="add", text="我的 GitHub token 是 ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
        _tool(action="explode"),
        _tool(action="forget", target="根本不存在的记忆"),
        "处理完了",
    )
    replies: list[str] = []
    result = run_turn(rt, msg("帮我记一下 token"), replies.append)

    answers = [m["content"] for m in ollama.chat_requests[-1]["messages"] if m["role"] == "tool"]
    assert (
        '"rejected:secret"' in answers[0]
        and "action must be" in answers[1]
        and "no single memory" in answers[2]
    )
    assert result.tool_calls == 3 and replies == ["处理完了"]
    assert "ghp_" not in memory_file(rt)


def test_the_tool_loop_is_bounded(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = make_runtime(data_dir, redis_url, ollama=ollama)
    ollama.script(*[_tool(action="add", text=f"第{i}件要紧事是{i * 37}号文件") for i in range(10)])
    replies: list[str] = []
    run_turn(rt, msg("我有很多事实"), replies.append, TurnLimits(tool_rounds=2))
    # Two rounds of tools, then one last call that offers none; a tool call there is not run.
    assert len(ollama.chat_requests) == 3 and not ollama.chat_requests[-1].get("tools")
    assert replies == ["好的，记下了。"]
    assert "第1件" in memory_file(rt) and "第2件" not in memory_file(rt)


def test_an_explicit_remember_is_kept_even_if_the_model_forgets_its_tool(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = make_runtime(data_dir, redis_url, ollama=ollama)
    ollama.script("好的！")
    say(rt, "记住我对花生过敏")
    assert "我对花生过敏" in memory_file(rt)
    jobs = [j for j in queue("memory", rt.redis).jobs if not j.id.startswith("flush-")]
    [job] = jobs  # background extraction, as the second safety net
    assert job.args[0] == str(Namespace.of("t1", "alice", "default")) and job.args[1] == "记住我对花生过敏"


def test_ollama_down_answers_from_memory_and_then_stops_trying_for_a_while(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = make_runtime(data_dir, redis_url, ollama=ollama)
    ollama.down()
    first = say(rt, "我住在余杭区")
    ollama.up()
    second = say(rt, "我在哪")
    assert "我记住了" in first and "暂时不可用" in first
    assert "余杭区" in second and "暂时不可用" in second
    assert ollama.chat_requests == []  # the model was skipped while flagged down


def test_a_slow_ollama_costs_one_short_timeout(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = make_runtime(data_dir, redis_url, ollama=ollama)
    ollama.script("好的，我记住了。")  # memory first (the model answers it; unscripted it would 500, and the
    say(rt, "记住我住在余杭区")  # model would be skipped as down: the timeout below would never be tested)
    asked = len(ollama.chat_requests)
    assert asked == 1 and ollama.errors == []
    ollama.script(Delay(5.0, "too late"))
    answer = say(rt, "我在哪")
    # Had the turn waited past its 1 s model timeout it would have sent "too late"; had it retried, the
    # fake would have seen a second request. Neither: one request, and the answer came from memory.
    assert "余杭区" in answer and "暂时不可用" in answer and "too late" not in answer
    assert len(ollama.chat_requests) == asked + 1


# ------------------------------------------------------------------------------------------- delivery


def test_an_undelivered_reply_is_not_recorded_as_said(rt: Runtime) -> None:
    def broken(_: str) -> None:
        raise FeishuError("reply: code 230002 (bot not in chat)", code=230002)

    inbound = msg("你好")
    result = run_turn(rt, inbound, broken)
    raw = "".join(p.read_text() for p in (rt.store.path(inbound.ns) / "raw").iterdir())
    assert not result.delivered and inbound.message_id in raw and f"{inbound.message_id}:reply" not in raw


def test_messages_of_one_person_are_answered_oldest_first(rt: Runtime, redis_client: redis.Redis) -> None:
    intake = Intake(redis_client)
    first, second = msg("第一条"), msg("第二条")
    assert intake.accept(second) and intake.accept(first) and not intake.accept(first)
    answered: list[str] = []

    outcome = Mailbox(redis_client).deliver(second, lambda m: answered.append(m.text))
    again = Mailbox(redis_client).deliver(first, lambda m: answered.append(m.text))

    assert answered == ["第一条", "第二条"]
    assert (outcome, again) == ("answered 1; handed on", "answered 1")


def test_a_backlog_holds_one_place_in_the_queue_and_turns_go_round_robin(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    """A person with a backlog holds one place in the chat queue, not one per message: their turn job answers
    their oldest message and hands on to the BACK of the queue, behind whoever wrote meanwhile. The jobs run
    here exactly as a worker takes them, oldest first."""
    intake = Intake(redis_client)
    flood = [msg(f"第{i}条") for i in range(1, 6)]
    others = [msg("我是鲍勃", user="bob"), msg("我是卡罗尔", user="carol")]
    assert all(intake.accept(m) for m in flood)
    assert all(intake.accept(m) for m in others)
    chat = queue("chat", redis_client)
    assert chat.count == 3  # one turn job per person, however many messages they sent
    answered: list[str] = []
    mailbox = Mailbox(redis_client)
    while (job_id := redis_client.lpop(chat.key)) is not None:
        job = fetch(job_id.decode(), redis_client)
        mailbox.deliver(Inbound.from_json(job.args[0]), lambda m: answered.append(m.text), job_id=job.id)
    assert answered == ["第1条", "我是鲍勃", "我是卡罗尔", "第2条", "第3条", "第4条", "第5条"]
    assert redis_client.zcard(f"lucid:inbox:{flood[0].ns.key}") == 0
    assert redis_client.exists(f"lucid:turnjob:{flood[0].ns.key}") == 0  # done: the next message enqueues


def test_lucid_chat_runs_the_same_turn_from_piped_input(data_dir: Path) -> None:
    rt = make_runtime(data_dir, None)  # no Redis at all: the terminal chat still works
    parser = argparse.ArgumentParser()
    chat_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["chat", "--user", "alice", "--tenant", "t1"])
    out = io.StringIO()

    code = chat_cli.run(
        args, rt, io.StringIO("我住在余杭区\n\n我现在在西湖区\n我在哪\n/quit\n我叫小明\n"), out
    )

    replies = out.getvalue().strip().split("\n")
    assert code == 0 and "西湖区" in replies[-2] and "小明" not in out.getvalue()
    assert "sup=" in memory_file(rt)


def test_a_paced_chat_hands_on_instead_of_sleeping_while_others_wait(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    """A person whose chat cannot be sent to yet (Feishu's 4/s per chat) does not hold the worker in the
    pacer while someone else waits: the job goes to the back untouched. With nobody waiting, it answers."""
    intake = Intake(redis_client)
    mine, theirs = msg("我的消息"), msg("别人的消息", user="bob")
    assert intake.accept(mine) and intake.accept(theirs)
    chat = queue("chat", redis_client)
    answered: list[str] = []
    now = itertools.count(0.0, 0.001)  # an injected clock and wait: the machine's speed does not matter
    paced = Mailbox(
        redis_client,
        pace=lambda m: 0.2 if m.user == "alice" else 0.0,
        sleep=lambda seconds: None,
        clock=lambda: next(now),
        lead=TurnTime(0.05),  # a turn here takes 50 ms
    )

    job = fetch(redis_client.lpop(chat.key).decode(), redis_client)  # alice's, first in the queue
    assert paced.deliver(Inbound.from_json(job.args[0]), answered.append, job_id=job.id) == (
        "answered 0; handed on"
    )
    assert answered == [] and chat.count == 2  # bob's job, then alice's again behind it
    while (job_id := redis_client.lpop(chat.key)) is not None:  # bob's; then alice's, with nobody waiting
        job = fetch(job_id.decode(), redis_client)
        paced.deliver(Inbound.from_json(job.args[0]), lambda m: answered.append(m.text), job_id=job.id)
    assert answered == ["别人的消息", "我的消息"]


def test_a_paced_job_hands_on_the_moment_someone_writes_while_it_waits(
    rt: Runtime, redis_client: redis.Redis
) -> None:
    """Nobody waits when alice's job finds her chat paced (Feishu's 4/s), so it waits for the slot — but
    not in the pacer, where it would hold the worker through her turn: bob writes while it waits, and the
    job hands on at once, untouched, so bob is answered first. The wait's clock is injected: bob's message
    arrives during the job's first look away (still queued at the next look: no other worker is free), and
    the job's 0.2 s never pass."""
    intake = Intake(redis_client)
    mine, theirs = msg("我的消息"), msg("别人的消息", user="bob")
    assert intake.accept(mine)
    chat = queue("chat", redis_client)
    answered: list[str] = []
    naps: list[float] = []

    def nap(seconds: float) -> None:  # the worker's wait: bob writes during it
        naps.append(seconds)
        if len(naps) == 1:
            assert intake.accept(theirs)

    now = itertools.count(0.0, 0.001)  # 1 ms per look at the clock: the 0.2 s slot is far off
    paced = Mailbox(
        redis_client,
        pace=lambda m: 0.2 if m.user == "alice" else 0.0,
        sleep=nap,
        clock=lambda: next(now),
        lead=TurnTime(0.05),  # a turn here takes 50 ms: it would start 120 ms before the slot
    )
    job = fetch(redis_client.lpop(chat.key).decode(), redis_client)  # alice's; the queue is empty now
    assert chat.count == 0
    outcome = paced.deliver(Inbound.from_json(job.args[0]), lambda m: answered.append(m.text), job_id=job.id)
    assert (outcome, answered, len(naps)) == (
        "answered 0; handed on",
        [],
        2,
    )  # bob still queued at the next look
    while (job_id := redis_client.lpop(chat.key)) is not None:  # bob's first, then alice's behind him
        job = fetch(job_id.decode(), redis_client)
        Mailbox(redis_client).deliver(
            Inbound.from_json(job.args[0]), lambda m: answered.append(m.text), job_id=job.id
        )
    assert answered == ["别人的消息", "我的消息"]
