"""The memory viewer: behind the admin token, read-only, and in a real headless browser the timeline shows
the supersede chain 余杭区 → 西湖区 → 余杭区 (a screenshot is saved under test-artifacts/)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aiohttp import web

from bot import viewer
from memory_core.namespace import Namespace
from memory_core.ops import Remember
from tests.browser import CHROMIUM_ARGS, chromium_path
from tests.fakes.ollama import BackgroundServer
from workers.runtime import build
from workers.settings import Settings

NS = Namespace.of("t1", "alice", "default")
T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
TOKEN = "s3cret-admin-token"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


class AppServer(BackgroundServer):
    def __init__(self, app: web.Application) -> None:
        super().__init__()
        self._app = app

    def build_app(self) -> web.Application:
        return self._app


def _story(data_dir: Path) -> web.Application:
    runtime = build(
        Settings(
            data_dir=data_dir,
            admin_token=TOKEN,
            now=T0 + timedelta(days=60),
            config_path=data_dir / "none.toml",
        )
    )
    steps = [
        "我在余杭区",
        "我搬到西湖区了",
        "我又回到余杭区了",
        "我喜欢<b>深色</b>主题<script>alert(1)</script>",
    ]
    for i, text in enumerate(steps):
        runtime.writer.clock = lambda i=i: T0 + timedelta(days=20 * i)
        runtime.writer.submit(NS, [Remember(text=text, type="preference" if "主题" in text else "fact")])
    app = web.Application()
    viewer.mount(app, runtime)
    return app


async def test_api_needs_the_token_and_shows_the_chain(aiohttp_client, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    client = await aiohttp_client(_story(data_dir))
    assert (await client.get("/admin/api/namespaces")).status == 401
    assert (await client.get("/admin/viewer?token=wrong")).status == 401
    bad = await client.get("/admin/api/namespaces", headers={"Authorization": "Bearer nope"})
    assert bad.status == 401
    ok = await client.get("/admin/api/ns/t1/alice/default", headers={"Authorization": f"Bearer {TOKEN}"})
    data = await ok.json()
    chain = [s["text"] for s in data["timelines"]["所在地"]]
    assert chain == ["我在余杭区", "我搬到西湖区了", "我又回到余杭区了"]
    assert [s["current"] for s in data["timelines"]["所在地"]] == [False, False, True]
    assert data["resident"][0]["text"].startswith("我喜欢<b>")
    missing = await client.get(
        "/admin/api/ns/t1/nobody/default", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert missing.status == 404


async def test_a_person_whose_id_was_hashed_opens_from_the_list(aiohttp_client, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """The list gives the folder names; a hashed one (`h-…`) must open that folder, not a hash of it."""
    app = _story(data_dir)
    hashed = Namespace.of("t1", "张三", "default")
    app[viewer.RUNTIME].writer.submit(hashed, [Remember(text="我对花生过敏")])
    client = await aiohttp_client(app)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    rows = (await (await client.get("/admin/api/namespaces", headers=auth)).json())["namespaces"]
    row = next(r for r in rows if r["user"].startswith("h-"))
    page = await client.get(f"/admin/api/ns/{row['tenant']}/{row['user']}/{row['persona']}", headers=auth)
    assert page.status == 200
    assert "我对花生过敏" in json.dumps(await page.json(), ensure_ascii=False)


async def test_namespace_api_and_page_refuse_every_request_without_the_admin_token(
    aiohttp_client, data_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    """No header, a wrong bearer, a wrong cookie: 401 and not a byte of memory or of the page (each on a
    server of its own: a client's sixth wrong bearer within five minutes is refused with 429)."""
    wrong = [
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Cookie": "lucid_admin=nope"},
    ]
    for headers in wrong:
        client = await aiohttp_client(_story(data_dir))
        for path in (
            "/admin/api/ns/t1/alice/default",
            "/admin/api/ns/t1/alice/default?q=余杭区",
            "/admin/viewer",
        ):
            resp = await client.get(path, headers=headers, allow_redirects=False)
            body = await resp.text()
            assert resp.status == 401, (path, headers, resp.status)
            assert "alice" not in body and "<html" not in body.lower(), (path, headers)
            assert "token" in body, body  # says what is missing
            if path.startswith("/admin/api/"):
                assert resp.headers.get("WWW-Authenticate") == "Bearer"  # and how to authenticate
    right = {"Authorization": f"Bearer {TOKEN}"}
    page = await client.get("/admin/viewer", headers=right)
    assert page.status == 200 and "<html" in (await page.text()).lower()
    api = await client.get("/admin/api/ns/t1/alice/default", headers=right)
    assert api.status == 200 and (await api.json())["namespace"] == "t1/alice/default"


async def test_logging_in_once_with_the_token_lets_the_cookie_open_page_and_api(
    aiohttp_client, data_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    """The browser flow: /admin/viewer?token=… once, then the HttpOnly cookie alone opens the page and the
    API (no bearer header); without that login the same client gets 401."""
    client = await aiohttp_client(_story(data_dir))
    assert (await client.get("/admin/api/ns/t1/alice/default")).status == 401
    wrong = await client.get("/admin/viewer?token=nope", allow_redirects=False)
    assert wrong.status == 401 and "token" in await wrong.text() and "Set-Cookie" not in wrong.headers
    login = await client.get(f"/admin/viewer?token={TOKEN}", allow_redirects=False)
    assert login.status == 302 and login.headers["Location"] == "/admin/viewer"
    cookie = login.headers["Set-Cookie"]  # never readable by page scripts, never sent cross-site
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/admin" in cookie
    page = await client.get("/admin/viewer")
    assert page.status == 200 and "<html" in (await page.text()).lower()
    assert page.content_type == "text/html"  # rendered, not offered as a download or sniffed
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]  # memory text never runs as code
    api = await client.get("/admin/api/ns/t1/alice/default")
    assert api.status == 200 and (await api.json())["namespace"] == "t1/alice/default"


async def test_no_token_configured_means_no_viewer(aiohttp_client, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    runtime = build(Settings(data_dir=data_dir, config_path=data_dir / "none.toml"))
    app = web.Application()
    viewer.mount(app, runtime)
    client = await aiohttp_client(app)
    assert (await client.get("/admin/viewer")).status == 404
    assert (await client.get("/admin/api/namespaces", headers={"Authorization": "Bearer x"})).status == 404


def test_viewer_page_in_headless_chromium(data_dir: Path) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with AppServer(_story(data_dir)) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(f"{server.url}/admin/viewer?token={TOKEN}")
            page.wait_for_selector("body[data-ready='1']", timeout=15_000)
            chain = page.locator("#timelines .chain[data-subject='所在地'] .step")
            texts = [t.split("\n")[0] for t in chain.all_inner_texts()]
            assert texts == ["我在余杭区", "我搬到西湖区了", "我又回到余杭区了"]
            assert "current" in (chain.nth(2).get_attribute("class") or "")
            assert "2026-06-01 – 2026-06-21" in chain.nth(0).inner_text()
            resident = page.locator("#resident").inner_text()
            assert "<script>alert(1)</script>" in resident and not dialogs  # shown as text, never run
            page.screenshot(path=str(ARTIFACTS / "viewer.png"), full_page=True)
        finally:
            browser.close()
    assert (ARTIFACTS / "viewer.png").stat().st_size > 10_000


async def test_a_forgotten_memory_is_not_read_back_from_the_dream_diffs(
    aiohttp_client, data_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    """The viewer shows what each dream changed, from git history, where a forgotten line stays until
    `forget --purge`: a forgotten fact was one click away on the operator's page."""
    from memory_core.ops import Forget
    from workers.dreaming import run_phase

    app = _story(data_dir)
    runtime = app[viewer.RUNTIME]
    runtime.writer.clock = lambda: T0 + timedelta(days=59)
    ns = Namespace.of("t1", "carol", "default")
    runtime.writer.submit(ns, [Remember(text="我对青霉素过敏，打针前要说")])
    memory = ns.path(data_dir) / "MEMORY.md"
    memory.write_text(memory.read_text("utf-8") + "- 我对青霉素过敏，打针前一定要说\n", "utf-8")
    assert run_phase(runtime, ns, "light")["counts"].get("merged") == 1
    auth = {"Authorization": f"Bearer {TOKEN}"}
    client = await aiohttp_client(app)

    async def diffs() -> str:
        data = await (await client.get("/admin/api/ns/t1/carol/default", headers=auth)).json()
        return "\n".join(d["diff"] for d in data["dreams"])

    before = await diffs()
    assert "打针前一定要说" in before and "打针前要说" in before  # the merge, as it was
    for e in runtime.memory.book(ns).entries() + runtime.memory.book(ns).archived():
        runtime.writer.submit(ns, [Forget(e.id)])
    after = await diffs()
    assert "青霉素" not in after and "〔no longer held" in after
