"""Issue 15 (7, last): a huge hand-edited line is set aside verbatim and reported; later writes stay cheap.

A person pasted 20 million characters into MEMORY.md; every later write parsed, scanned and scored that
line again (52 s, 450 MB each). Now a line over `MAX_LINE_CHARS` is never read as memory: the writer moves it,
byte for byte but for its secrets (redacted, like every hand edit), to the namespace's private state (not
git), leaves a note in its place, says so in the
commit and the log, and `lucid show` reports it. Sizes here are small (the rule is the length, not the time);
the 20-million-character run is `bench/index_cost.py --hand-line 20000000` (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from memory_core.lineformat import MAX_LINE_CHARS
from memory_core.namespace import Namespace
from memory_core.ops import Remember
from memory_core.writer import Writer
from tests.reliability.harness import git, lucid_cli

NS = Namespace.of("t", "u", "p")


def test_an_oversized_hand_edited_line_is_set_aside_verbatim_and_reported(
    local_writer: Writer, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local_writer.submit(NS, [Remember("我住在杭州")])
    memory = NS.path(data_dir) / "MEMORY.md"
    blob = "- " + "粘贴进来的很长一段" * (MAX_LINE_CHARS // 4)
    memory.write_text(memory.read_text() + blob + "\n- 我喜欢喝龙井\n")
    with caplog.at_level(logging.WARNING, logger="memory_core.writer"):
        outcome = local_writer.submit(NS, [Remember("我喜欢爬山")])[0]
    assert outcome.status == "added"
    text = memory.read_text()
    assert blob not in text and "lucid:set-aside" in text
    assert "我住在杭州" in text and "我喜欢喝龙井" in text and "我喜欢爬山" in text  # nothing else lost
    kept = list((NS.path(data_dir) / ".lucid" / "set-aside").iterdir())
    assert [p.read_text() for p in kept] == [blob]  # verbatim
    assert str(kept[0].relative_to(NS.path(data_dir))) in text
    assert any("set aside a hand-edited line" in r.getMessage() for r in caplog.records)
    history = git(NS.path(data_dir), "log", "-p", "--format=%s")
    assert "oversized line(s) set aside" in history and "粘贴进来的很长一段" * 8 not in history
    # The operator sees it in `lucid show`, and the next write does not touch it again.
    shown = lucid_cli(data_dir, "show", "--tenant", "t", "--user", "u", "--persona", "p").stdout
    assert "set aside" in shown
    assert local_writer.submit(NS, [Remember("我养了一只猫")])[0].status == "added"
    assert len(list((NS.path(data_dir) / ".lucid" / "set-aside").iterdir())) == 1


def test_an_oversized_line_not_yet_written_over_is_reported_not_read(
    local_writer: Writer, data_dir: Path
) -> None:
    local_writer.submit(NS, [Remember("我住在杭州")])
    memory = NS.path(data_dir) / "MEMORY.md"
    memory.write_text(memory.read_text() + "- " + "x" * (MAX_LINE_CHARS + 1) + "\n")
    out = lucid_cli(data_dir, "show", "--json", "--tenant", "t", "--user", "u", "--persona", "p").stdout
    assert f"over {MAX_LINE_CHARS:,}" in out
    assert "x" * 100 not in out.split('"problems"')[0]  # never shown as a memory


def test_secrets_in_a_set_aside_line_are_redacted_and_reported(
    local_writer: Writer, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What is set aside keeps every character of the line but its credentials: a password and a token
    inside a pasted blob — one of them across the edge of the detector's 64 Ki-character scan window —
    are redacted in the kept file, and the commit and the log say how many. Nothing is in clear anywhere
    under the namespace (the set-aside file, MEMORY.md, git)."""
    local_writer.submit(NS, [Remember("我住在杭州")])
    root = NS.path(data_dir)
    memory = root / "MEMORY.md"
    token = "ghp_" + "Zq8vR2mK7xW4pL9nT3bY6cF1hJ5sD0gA2eU8"
    head = "- 粘贴的笔记 " + "今天天气很好，" * 1200 + "我的密码是 hunter2x9，"
    edge = 1 << 16  # the scan window
    filler = "会议记录在这里，" * ((edge - len(head)) // 8)
    head += filler[: edge - len(head) - 10]
    blob = head + f"token: {token} " + "后面还有很多内容。" * 3000
    assert len(head) < edge < len(head) + 10 + len(token) and len(blob) > MAX_LINE_CHARS
    memory.write_text(memory.read_text() + blob + "\n- 我喜欢喝龙井\n")
    with caplog.at_level(logging.WARNING, logger="memory_core.writer"):
        assert local_writer.submit(NS, [Remember("我喜欢爬山")])[0].status == "added"
    [kept] = list((root / ".lucid" / "set-aside").iterdir())
    expected = blob.replace("hunter2x9", "[REDACTED:password]").replace(token, "[REDACTED:github_token]")
    assert kept.read_text() == expected  # every other character as written
    assert "我喜欢喝龙井" in memory.read_text() and "我喜欢爬山" in memory.read_text()
    everything = "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())
    everything += git(root, "log", "-p", "--format=%s")
    assert "hunter2x9" not in everything and token not in everything
    assert "2 secret(s) redacted" in git(root, "log", "--format=%s")
    assert any("2 secret(s) in it redacted" in r.getMessage() for r in caplog.records)
