"""Issue 15 (5 and "secret-only"): the secrets the detector missed, and statements that are only a secret.

Through the real single writer with git, as a message (raw archive), as a memory (a tool call or the
memory-only path) and as what extraction submits after reading the redacted archive. What must hold: the
secret is nowhere on disk or in git, the person is refused politely, and a statement that is only a
redacted secret is refused, not stored as `…[REDACTED:password]` (two of those would be near-duplicates).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from memory_core.lineformat import RawMessage
from memory_core.namespace import Namespace
from memory_core.ops import Record, Remember, message_to_json
from memory_core.writer import Writer
from tests.reliability.harness import files_text, git_everything, lucid_cli

NS = Namespace.of("t", "u", "p")
# The five, then one of each class it names (words other than 密码, service keys, abbreviations).
MISSED = [
    ("我的密码是芝麻开门", "芝麻开门"),
    ("我的银行密码是芝麻开门", "芝麻开门"),
    ("password: correct-horse-battery", "correct-horse-battery"),
    ("我的密码是 abc def ghi", "abc def ghi"),
    ("Feishu encrypt key EK-9fQ2xL7mZ4cB8tR1", "EK-9fQ2xL7mZ4cB8tR1"),
    ("口令是天王盖地虎", "天王盖地虎"),
    ("接头暗号：宝塔镇河妖", "宝塔镇河妖"),
    ("我的支付密码是 river 42 stone", "river 42 stone"),
    ("wifi pw is sunny2024", "sunny2024"),
    ("DeepSeek api key Zx81kLmq0PaB7cD2eF3gH4jK", "Zx81kLmq0PaB7cD2eF3gH4jK"),
]


def _everything(data: Path) -> str:
    root = NS.path(data)
    return "\n".join(text for _, text in files_text(root)) + git_everything(root)


@pytest.mark.parametrize(("text", "secret"), MISSED, ids=[m[1] for m in MISSED])
def test_a_missed_secret_is_refused_as_memory_and_redacted_in_the_archive(
    local_writer: Writer, data_dir: Path, text: str, secret: str
) -> None:
    msg = RawMessage("om_1", datetime(2026, 6, 1, 9, tzinfo=UTC), "u", text, "oc_1")
    recorded, remembered = local_writer.submit(NS, [Record(message_to_json(msg)), Remember(text)])
    assert recorded.detail == "redacted"
    assert remembered.status == "rejected:secret"
    assert secret not in _everything(data_dir)
    assert "[REDACTED:" in (NS.path(data_dir) / "raw" / "2026-06-01.md").read_text()


def test_a_statement_that_is_only_a_redacted_secret_is_refused_and_never_collides(
    local_writer: Writer, data_dir: Path
) -> None:
    # What extraction or replay hands the writer after reading the (redacted) raw archive.
    outcomes = local_writer.submit(
        NS,
        [
            Remember("用户的密码是 [REDACTED:password]"),
            Remember("用户的银行密码是 [REDACTED:password]"),
            Remember("我住在杭州"),
        ],
    )
    assert [o.status for o in outcomes[:2]] == ["rejected:secret", "rejected:secret"]
    assert outcomes[2].status == "added"
    memory = (NS.path(data_dir) / "MEMORY.md").read_text()
    assert "REDACTED" not in memory and "我住在杭州" in memory


def test_the_person_is_told_plainly_and_nothing_is_kept(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = lucid_cli(data, "remember", "我的密码是芝麻开门", "--user", "u", check=False)
    assert out.returncode != 0 or "secret" in out.stdout.lower()
    assert "芝麻开门" not in out.stdout + out.stderr
    shown = lucid_cli(data, "show", "--all", "--user", "u", check=False)
    assert "芝麻开门" not in shown.stdout and "REDACTED" not in shown.stdout
