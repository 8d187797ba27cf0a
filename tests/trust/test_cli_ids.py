"""The `lucid` command works with people, not against them: the 8-character ids `lucid show` prints work
wherever an id is taken (an ambiguous prefix gets a clear error), a superseded entry cannot be pinned,
every bad argument is one clear line and a non-zero exit (never a traceback), `--as-of` takes ISO and
relative times, `lucid search` says why each hit matched, and active recall's budget is a real timeout."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from bot import cli
from memory_core.lineformat import RawMessage, parse_file
from tests.trust.turns import TENANT, make_runtime, memory_file, ns, turn
from workers.memory_service import MemoryService

FACTS = [
    {"kind": "fact", "id": "aaaa1111bbbb0001", "text": "我喜欢喝乌龙茶"},
    {"kind": "fact", "id": "aaaa1111cccc0002", "text": "我周末喜欢爬山"},
    {"kind": "fact", "id": "dddd2222eeee0003", "text": "I run every morning at 6"},
]


@pytest.fixture
def lucid(
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):  # type: ignore[no-untyped-def]
    """Run `lucid ARGS` in this process against the suite's Redis: (exit code, stdout, stderr)."""
    monkeypatch.setenv("REDIS_URL", redis_url)

    def run(*args: str) -> tuple[int, str, str]:
        argv = [*args, "--data", str(data_dir), "--tenant", TENANT, "--user", "alice"]
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's own errors
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def _one_clear_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _import(lucid, tmp_path: Path, rows: list[dict[str, object]]) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows), "utf-8")
    code, _, err = lucid("import", str(path), "--quiet")
    assert code == 0, err


def test_the_printed_8_character_ids_work_for_pin_and_forget(lucid, tmp_path: Path, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    _import(lucid, tmp_path, FACTS)
    code, shown, _ = lucid("show")
    assert code == 0 and "dddd2222  I run every morning at 6" in shown

    code, _, err = lucid("pin", "dddd2222")
    assert code == 0, err
    memory = (data_dir / TENANT / "alice" / "default" / "MEMORY.md").read_text("utf-8")
    assert [e.id for e in parse_file(memory).entries() if e.pinned] == ["dddd2222eeee0003"]
    code, _, err = lucid("forget", "dddd2222")
    assert code == 0, err
    memory = (data_dir / TENANT / "alice" / "default" / "MEMORY.md").read_text("utf-8")
    assert "I run every morning" not in memory and "我喜欢喝乌龙茶" in memory


def test_an_ambiguous_prefix_is_refused_with_the_candidates(lucid, tmp_path: Path, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    _import(lucid, tmp_path, FACTS)
    for verb in ("pin", "forget"):
        code, _, err = lucid(verb, "aaaa1111")
        line = _one_clear_line(err)
        assert code == 2 and "ambiguous" in line and "aaaa1111bbbb" in line and "aaaa1111cccc" in line
    memory = (data_dir / TENANT / "alice" / "default" / "MEMORY.md").read_text("utf-8")
    assert "我喜欢喝乌龙茶" in memory and "我周末喜欢爬山" in memory  # nothing lost, nothing pinned
    assert all(not e.pinned for e in parse_file(memory).entries())
    code, out, _ = lucid("forget", "aaaa1111cccc")  # a longer prefix is unique
    assert code == 0 and "forgotten aaaa1111cccc0002" in out


def test_pinning_a_superseded_entry_is_refused(lucid, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    code, first, _ = lucid("remember", "我住在余杭区", "--json")
    old = json.loads(first)["id"]
    lucid("remember", "我住在西湖区")

    code, _, err = lucid("pin", old[:8])

    line = _one_clear_line(err)
    assert code == 2 and "superseded" in line and "西湖区" in line
    memory = (data_dir / TENANT / "alice" / "default" / "MEMORY.md").read_text("utf-8")
    assert all(not e.pinned for e in parse_file(memory).entries())


def test_pinning_a_superseded_entry_from_chat_is_refused(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    rt = make_runtime(data_dir, redis_url)
    turn(rt, "我住在余杭区")
    turn(rt, "我现在在西湖区")
    old = next(e for e in parse_file(memory_file(rt)).entries() if e.text == "我住在余杭区")
    reply, _ = turn(rt, f"/pin {old.id[:8]}")
    assert "superseded" in reply and "已置顶" not in reply
    assert all(not e.pinned for e in parse_file(memory_file(rt)).entries())


@pytest.mark.parametrize(
    "when", ["yesterday", "3d", "12h", "3d ago", "today", "2026-01-01", "2026-01-01T09:00:00Z"]
)
def test_as_of_takes_iso_and_relative_times(lucid, when: str) -> None:  # type: ignore[no-untyped-def]
    lucid("remember", "我住在余杭区")
    code, out, err = lucid("recall", "我住在哪", "--as-of", when, "--json")
    assert code == 0, err
    assert json.loads(out)["as_of"]


def test_relative_as_of_is_counted_back_from_now(lucid, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LUCID_NOW", "2026-06-10T15:30:00Z")
    lucid("remember", "我住在余杭区")
    expected = {
        "yesterday": "2026-06-09T00:00:00Z",
        "3d": "2026-06-07T15:30:00Z",
        "12h": "2026-06-10T03:30:00Z",
    }
    for when, at in expected.items():
        _, out, _ = lucid("recall", "我住在哪", "--as-of", when, "--json")
        assert json.loads(out)["as_of"] == at


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("recall", "我住在哪", "--as-of", "lastweek"), "--as-of"),
        (("recall", "我住在哪", "--as-of", "2026-13-45"), "--as-of"),
        (("recall", "我住在哪", "--k", "many"), "--k"),
        (("show", "--bogus"), "--bogus"),
        (("pin",), "id"),
        (("forget", "ab"), "too short"),
    ],
)
def test_every_bad_argument_is_one_clear_line_and_a_non_zero_exit(
    lucid, args: tuple[str, ...], says: str
) -> None:  # type: ignore[no-untyped-def]
    code, _, err = lucid(*args)
    assert code != 0 and says in _one_clear_line(err)


def test_a_file_given_as_data_directory_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    readme = tmp_path / "README.md"
    readme.write_text("# not a data dir\n")
    code = cli.main(["show", "--data", str(readme)])
    err = capsys.readouterr().err
    assert code == 2 and "not a data directory" in _one_clear_line(err)
    assert readme.read_text() == "# not a data dir\n"


def test_search_says_why_every_hit_matched(lucid, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    day = "2026-01-05T09:0{}:00Z"
    rows = [
        {"kind": "message", "id": "m1", "ts": day.format(1), "speaker": "alice", "text": "你早上一般喝什么？", "session": "s1"},
        {"kind": "message", "id": "m2", "ts": day.format(2), "speaker": "alice", "text": "我早上一般喝咖啡", "session": "s1"},
        {"kind": "message", "id": "m3", "ts": day.format(3), "speaker": "bot", "text": "好的，美式还是拿铁？", "session": "s1"},
        {"kind": "message", "id": "m4", "ts": day.format(4), "speaker": "alice", "text": "今天中午吃了咖喱饭", "session": "s2"},
        {"kind": "message", "id": "m5", "ts": day.format(5), "speaker": "alice", "text": "I drink coffee every morning", "session": "s3"},
    ]  # fmt: skip
    _import(lucid, tmp_path, rows)

    code, out, _ = lucid("search", "咖啡", "--json")
    results = json.loads(out)["results"]

    assert code == 0 and results[0]["id"] == "m2" and results[0]["matched"] == ["咖啡"]
    for hit in results:  # a line without 咖啡 says why it is there
        if "咖啡" not in hit["text"]:
            assert "context turn" in hit["why"] or "partly matched" in hit["why"], hit
    context = [h for h in results if h["context"]]
    assert all("咖啡" in h["context"]["text"] for h in context)
    code, text, _ = lucid("search", "咖啡")
    assert "matched 咖啡" in text


def test_active_recall_stops_waiting_at_its_budget(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """A search that cannot finish (here: the index is busy in another thread) costs the turn its budget,
    not the search's time: the budget is a timeout, not a check made afterwards."""
    rt = make_runtime(data_dir, redis_url)
    mem = MemoryService(rt, active_budget=0.2)
    mem.record(ns(), RawMessage(id="om_1", ts=datetime(2026, 1, 2, tzinfo=UTC), speaker="alice",
               text="我上周去做了体检，血压有点高", chat="c", chat_type="p2p", role="user", session="old"))  # fmt: skip
    assert mem.active_recall(ns(), "体检结果怎么样", "now", "c")  # found when the index is free

    busy, release, returned = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with mem._raw_lock:  # the index is busy (a long catch-up, a slow disk)
            busy.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    busy.wait(5)
    got: list[object] = []

    def ask() -> None:
        got.extend(mem.active_recall(ns(), "体检结果怎么样", "now", "c"))
        returned.set()

    asker = threading.Thread(target=ask)
    asker.start()
    answered_while_busy = returned.wait(20)
    release.set()
    holder.join()
    asker.join()
    assert answered_while_busy and got == []


def test_an_id_shaped_like_a_hashed_one_gets_its_own_folder(
    data_dir: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An id that is not a safe path component lands in `h-<hash>`; another id that reads exactly like that
    hash must not land in the same folder and read the first person's memories (`erase` takes the folder's
    name too, as an operator reads it off the disk)."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    base = ["--data", str(data_dir), "--tenant", TENANT]
    assert cli.main(["remember", "我对花生过敏", *base, "--user", "张三"]) == 0
    folder = next(p.name for p in (data_dir / TENANT).iterdir())
    assert folder.startswith("h-")
    capsys.readouterr()

    assert cli.main(["show", *base, "--user", folder]) == 0
    assert "花生" not in capsys.readouterr().out
    assert cli.main(["show", *base, "--user", "张三"]) == 0
    assert "花生" in capsys.readouterr().out
    assert cli.main(["erase", *base, "--user", folder]) == 0  # the name `ls` shows erases that folder
    assert not (data_dir / TENANT / folder).exists()
