"""Bad input through `lucid`: a hand edit, an import file or an argument the product cannot use gets a clear
answer and loses nothing (found by a hostile review, 2026-12-03). The commands run in this process
(`bot.cli.main`), on real files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main

MEMORY = "default/default/default/MEMORY.md"


@pytest.fixture
def lucid(data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    import os

    for key in list(os.environ):
        if key.startswith(("LUCID_", "REDIS_URL", "OLLAMA_")):
            monkeypatch.delenv(key)

    def run(*args: str, code: int = 0) -> Any:
        capsys.readouterr()
        try:
            got = main([*args, "--data", str(data_dir)])
        except SystemExit as exc:  # a usage error, as argparse ends it
            got = exc.code
        out = capsys.readouterr()
        assert got == code, f"lucid {' '.join(args)}: exit {got}\n{out.out}\n{out.err}"
        if "--json" in args and code == 0:
            return json.loads(out.out)
        return out.out + out.err

    return run


def _hand_edit(data_dir: Path, *lines: str) -> None:
    (data_dir / MEMORY).write_text("# Memory\n\n## Recall\n\n" + "".join(f"{x}\n" for x in lines), "utf-8")


def test_a_hand_edited_time_out_of_range_is_one_unreadable_line_not_a_broken_namespace(
    lucid: Any, data_dir: Path
) -> None:
    """`vf=9999-12-31T23:59:59-14:00` is past year 9999 in UTC: it made every read of the namespace raise
    OverflowError, so the bot answered every message of that person with an apology."""
    lucid("remember", "seed")
    _hand_edit(
        data_dir,
        "- 我喜欢爬山 <!--m:id=bbbb2222;t=fact;vf=9999-12-31T23:59:59-14:00-->",
        "- 我喜欢下棋 <!--m:id=dddd2222;t=fact;vt=0001-01-01T00:00:00+14:00-->",
        "- 我养了一只猫 <!--m:id=cccc2222;t=fact-->",
    )
    shown = lucid("show")
    assert "cccc2222" in shown and shown.count("unreadable line kept as is") == 2, shown
    assert "time out of range" in shown
    assert [r["text"] for r in lucid("recall", "猫", "--json")["results"]] == ["我养了一只猫"]
    assert lucid("remember", "我喜欢游泳", "--json")["status"] == "added"
    kept = (data_dir / MEMORY).read_text("utf-8")
    assert "vf=9999-12-31T23:59:59-14:00" in kept and "vt=0001-01-01T00:00:00+14:00" in kept  # as typed
    assert "rejected" not in lucid("recall", "x", "--as-of", "2026-01-01")
    assert "is not a time" in lucid("recall", "x", "--as-of", "99999999d", code=2)


def test_an_escaped_lone_surrogate_in_a_hand_edit_is_kept_as_text(lucid: Any, data_dir: Path) -> None:
    """`\\u{d800}` is the file's own escape syntax for a code point that is no character: unescaped, it could
    not be encoded, so `show`, `recall` and every model turn of that person failed."""
    lucid("remember", "seed")
    _hand_edit(data_dir, "- 我喜欢 \\u{d800} 游泳 <!--m:id=cccc2222;t=fact-->")
    [hit] = lucid("recall", "游泳", "--json")["results"]
    assert hit["text"] == "我喜欢 \\u{d800} 游泳"
    lucid("remember", "我喜欢跑步")  # the file is written again: the line still says what was typed
    assert [r["text"] for r in lucid("recall", "游泳", "--json")["results"]] == ["我喜欢 \\u{d800} 游泳"]


def test_a_memory_whose_line_could_not_be_read_back_is_refused_not_confirmed(
    lucid: Any, data_dir: Path
) -> None:
    """A control character is written as an escape (`\\u{1}`, five characters): 1,900 of them passed the
    2,000-character limit, were confirmed as remembered, and made a line over 8,192 that no read takes."""
    lucid("remember", "我住在北京")
    refused = [
        ("remember", "我的暗号是" + "\x01" * 1900 + "结束"),
        ("remember", "我住在上海", "--subject", "s" * 9000),
    ]
    for args in refused:
        out = lucid(*args, code=3)
        assert out.startswith("rejected:too_long"), out
    assert (
        lucid("remember", "我的暗号是" + "天" * 1990, "--json")["status"] == "added"
    )  # the limit itself holds
    texts = [r["text"] for r in lucid("show", "--json")["results"]]
    assert texts[0] == "我住在北京" and len(texts) == 2 and "unreadable" not in lucid("show")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"kind":"fact","text":"bad \\ud800 surrogate"}', "lone surrogate"),
        ('{"kind":"fact","text":"x","hits":' + "1" * 5000 + "}", "not JSON this importer reads"),
        ('{"kind":"fact","text":"x","hits":10000000000}', "hits must be a whole number"),
        ('{"kind":"fact","text":"x","scope":' + "[" * 100_000 + "]" * 100_000 + "}", "recursion"),
        (
            '{"kind":"fact","text":"x","supersedes":[' + ",".join(f'"i{i}"' for i in range(2000)) + "]}",
            "at most",
        ),
        ('{"kind":"fact","text":"x","subject":"' + "s" * 65 + '"}', "longer than 64"),
        ('{"kind":"message","id":"m1","ts":"9999-12-31T23:59:59-14:00","text":"hi"}', "not an ISO time"),
    ],
)
def test_an_import_line_the_product_cannot_keep_is_named_and_nothing_is_written(
    lucid: Any, data_dir: Path, tmp_path: Path, line: str, says: str
) -> None:
    good = '{"kind":"fact","text":"我住在杭州"}'
    path = tmp_path / "in.jsonl"
    path.write_text(f"{good}\n{line}\n", "utf-8")
    out = lucid("import", str(path), code=2)
    assert "line 2" in out and says in out, out
    assert not (data_dir / MEMORY).exists()


def test_two_facts_with_one_id_in_an_import_are_refused_not_one_overwritten(
    lucid: Any, data_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(
        '{"kind":"fact","id":"same","text":"我住在杭州"}\n{"kind":"fact","id":"same","text":"我喜欢猫"}\n'
    )
    out = lucid("import", str(path), code=2)
    assert "line 2: duplicate id 'same' (also on line 1)" in out, out
    assert not (data_dir / MEMORY).exists()


def test_a_long_supersede_chain_listed_newest_first_imports_in_order(
    lucid: Any, data_dir: Path, tmp_path: Path
) -> None:
    """An export lists the newest fact first; ordering 1,000 of them recursively overflowed the stack."""
    n = 1000
    path = tmp_path / "chain.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "kind": "fact",
                    "id": f"f{i}",
                    "text": f"第{i}号版本",
                    "supersedes": [f"f{i + 1}"][: i < n - 1],
                }
            )
            + "\n"
            for i in range(n)
        ),
        "utf-8",
    )
    lucid("import", "--quiet", str(path))
    assert [r["text"] for r in lucid("show", "--json")["results"]] == ["第0号版本"]
    assert len(lucid("show", "--all", "--json")["results"]) == n


@pytest.mark.parametrize(
    "args",
    [
        ("recall", "x", "--k", "0"),
        ("recall", "x", "--k", "-1"),
        ("history", "--limit", "-5"),
        ("import", "--batch", "-1", "-"),
    ],
)
def test_a_count_that_is_not_a_positive_whole_number_is_a_usage_error(
    lucid: Any, args: tuple[str, ...]
) -> None:
    """`--batch -1` reported an import that wrote nothing; `--k 0` and `--limit -5` reached numpy and islice."""
    lucid("remember", "seed")
    out = lucid(*args, code=2)
    assert "must be a whole number from 1 to 100000" in out, out
