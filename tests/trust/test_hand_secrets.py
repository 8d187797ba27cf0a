"""A hand edit of MEMORY.md is committed with its secrets redacted (`writer._scrub`) wherever they were typed.
Found by a privacy review: the scan looked only at entries' words and unreadable lines, so a secret typed
into a heading or into a line's metadata comment was committed in clear, to the file and to git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from memory_core.secretscan import contains_secret
from tests.trust.turns import memory_file, ns, say
from workers.runtime import Runtime

OLLAMA_REPLY = "好的。"
TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def _git_objects(rt: Runtime) -> str:
    done = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        cwd=rt.store.path(ns()), capture_output=True, check=True,
    )  # fmt: skip
    return done.stdout.decode("utf-8", "replace")


@pytest.mark.parametrize(
    "typed",
    [
        f"- 公司仓库的令牌 {TOKEN}",  # positive control: an entry line is redacted
        f"## 工作 {TOKEN}",  # a heading
        f"- 我喜欢喝茶 <!--m:id=0123456789abcdef;t=fact;subj={TOKEN}-->",  # a line's metadata comment
        f"随手记一下 {TOKEN}",  # a line that is no entry
    ],
    ids=["entry_line", "heading", "metadata", "unparsed"],
)
def test_a_secret_typed_into_memory_md_by_hand_is_never_committed_in_clear(rt: Runtime, typed: str) -> None:
    assert contains_secret(typed)
    say(rt, "记住我喜欢爬山")
    path = rt.store.path(ns()) / "MEMORY.md"
    path.write_text(path.read_text() + "\n" + typed + "\n")
    say(rt, "今天天气不错")  # the next batch commits the hand edit
    assert (
        "manual edit"
        in subprocess.run(
            ["git", "log", "--format=%s"], cwd=rt.store.path(ns()), capture_output=True, text=True
        ).stdout
    )
    assert TOKEN not in memory_file(rt), "a credential stays in clear in MEMORY.md"
    assert TOKEN not in _git_objects(rt), "a credential was committed in clear to git"
    assert "爬山" in memory_file(rt)  # the rest of the file is as it was


@pytest.mark.parametrize("how", ["from_an_older_version", "emptied_by_hand"])
def test_the_vault_is_never_committed_whatever_the_namespaces_gitignore_says(
    how: str, tmp_path: Path
) -> None:
    """A namespace made before `.vault/` was in `.gitignore` kept the old file, and a hand edit's commit adds
    every file git does not ignore: the sealed secrets went into history. A person may also empty it."""
    from memory_core.namespace import Namespace
    from memory_core.ops import Remember
    from memory_core.store import Store
    from memory_core.vault import derive_key
    from memory_core.writer import Writer

    data, space, key = (
        tmp_path / "data",
        Namespace.of("t", "u", "p"),
        derive_key("correct horse battery staple"),
    )
    writer = Writer(Store(data), vault_key=key)
    assert writer.submit(space, [Remember(text="我喜欢爬山")])[0].status == "added"
    assert writer.submit(space, [Remember(text="我的银行卡密码是 Zt5#pL9!wQ2m")])[0].status != "added"
    root = space.path(data)
    assert (root / ".vault" / "secrets.enc").stat().st_size > 0  # sealed, beside the repository
    (root / ".gitignore").write_text(".lucid/\n*.tmp\n" if how == "from_an_older_version" else "")
    with (root / "MEMORY.md").open("a") as f:
        f.write("- 我养了一只猫\n")  # a hand edit: committed as the files stand
    if how == "from_an_older_version":
        writer = Writer(Store(data), vault_key=key)  # the upgraded product, a new process
    assert writer.submit(space, [Remember(text="我住在杭州")])[0].status == "added"

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout

    assert "manual edit" in git("log", "--format=%s")
    assert ".vault" not in git("log", "--all", "--name-only", "--format=")
    stored = git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
    assert git("hash-object", ".vault/secrets.enc").strip() not in stored  # not even as a loose blob
    if how == "from_an_older_version":  # brought up to date on disk, so git and the files agree
        assert (root / ".gitignore").read_text() == ".lucid/\n*.tmp\n.index/\n.vault/\n"
        assert git("status", "--porcelain") == ""
