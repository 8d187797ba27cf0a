"""The memory viewer: a read-only page for operators, behind the admin token (docs/ARCHITECTURE.md,
"The viewer")."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import secrets
import threading
import time
from collections import deque
from typing import Any

import redis
from aiohttp import web

from bot.headers import text_header
from memory_core.errors import LucidError
from memory_core.forgetting import held_diff
from memory_core.lineformat import format_time
from memory_core.namespace import Namespace, list_namespaces
from memory_core.ops import entry_to_json
from memory_core.recall import importance, recency
from memory_core.store import DREAMS
from memory_core.timeline import subject_timelines
from workers.errors import BadHeader
from workers.memory_service import MemoryService
from workers.redis_backend import FAILED_LOGINS
from workers.redis_keys import Keys
from workers.runtime import Runtime

log = logging.getLogger(__name__)

COOKIE = "lucid_admin"
SESSION_TTL = 8 * 3600
LOGINFAILED_LOGINS = 5  # per client address …
LOGIN_WINDOW = 300.0  # … in this many seconds, then 429 until the oldest failure ages out


class Sessions:
    """Viewer sessions: random ids (only their hash is kept) with an expiry, and failed-login counts (in
    Redis when there is one, so every replica counts the same failures)."""

    def __init__(self, client: redis.Redis | None, token: str = "", clock: Any = time.monotonic) -> None:
        self.client = client
        self.clock = clock
        # what a session holds: a session opened under another admin token is no session after a change
        self._mark = hashlib.sha256(f"lucid viewer session\0{token}".encode()).hexdigest()[:32]
        self._local: dict[str, float] = {}
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._failures_script = client.register_script(FAILED_LOGINS) if client is not None else None

    @staticmethod
    def _key(sid: str) -> str:
        return Keys.viewer_session(hashlib.sha256(sid.encode()).hexdigest())

    def open(self) -> str:
        sid = secrets.token_urlsafe(32)
        if self.client is not None:
            self.client.set(self._key(sid), self._mark, ex=SESSION_TTL)
        else:
            with self._lock:
                now = self.clock()
                self._local = {k: t for k, t in self._local.items() if t > now}
                self._local[self._key(sid)] = now + SESSION_TTL
        return sid

    def valid(self, sid: str) -> bool:
        if not sid or len(sid) > 128:
            return False
        if self.client is not None:
            held = self.client.get(self._key(sid))
            mark = held.decode() if isinstance(held, bytes) else str(held)
            return held is not None and hmac.compare_digest(mark, self._mark)
        with self._lock:
            return bool(self._local.get(self._key(sid), 0.0) > self.clock())

    def _count(self, who: str, add: bool) -> int:
        assert self._failures_script is not None
        key = Keys.viewer_failures(hashlib.sha256(who.encode()).hexdigest()[:32])
        window = int(LOGIN_WINDOW * 1000)
        return int(self._failures_script(keys=[key], args=[window, int(add), secrets.token_hex(8)]))

    def blocked(self, who: str) -> bool:
        if self._failures_script is not None:
            return self._count(who, add=False) >= LOGINFAILED_LOGINS
        with self._lock:
            recent = self._failures.get(who)
            while recent and recent[0] <= self.clock() - LOGIN_WINDOW:
                recent.popleft()
            return recent is not None and len(recent) >= LOGINFAILED_LOGINS

    def failed(self, who: str) -> int:
        """Count one failed login of `who`; how many are in the window now."""
        if self._failures_script is not None:
            return self._count(who, add=True)
        with self._lock:
            if len(self._failures) > 10_000:  # a flood of addresses must not grow this without bound
                self._failures.clear()
            recent = self._failures.setdefault(who, deque())
            recent.append(self.clock())
            return len(recent)


SERVICE: web.AppKey[MemoryService] = web.AppKey("viewer_service", MemoryService)
RUNTIME: web.AppKey[Runtime] = web.AppKey("viewer_runtime", Runtime)
SESSIONS: web.AppKey[Sessions] = web.AppKey("viewer_sessions", Sessions)


def _bearer(request: web.Request) -> str | None:
    try:
        header = text_header(request.headers, "Authorization")
    except BadHeader as exc:
        raise web.HTTPBadRequest(text=str(exc)) from exc
    return header[7:] if header.startswith("Bearer ") else None


async def authorised(request: web.Request, token: str | None) -> bool:
    """The admin token as a bearer header (constant time), or a live session cookie; no token → nobody."""
    if not token:
        return False
    given = _bearer(request)
    if given is not None:
        return await token_guess(request, request.app[RUNTIME], given, "viewer API")
    sid = request.cookies.get(COOKIE, "")
    return bool(sid) and await asyncio.to_thread(request.app[SESSIONS].valid, sid)


async def token_guess(request: web.Request, runtime: Runtime, given: str, what: str) -> bool:
    """Whether `given` is the admin token (constant time). Every way in — the viewer's `?token=`, a Bearer
    header on the viewer or the admin API — counts a wrong one against the client's address: after
    LOGINFAILED_LOGINS in LOGIN_WINDOW, 429 until the oldest ages out. Each is logged, never the guess."""
    token = runtime.settings.admin_token
    if not token:
        return False
    sessions = request.app[SESSIONS]
    who = client_address(request, runtime.settings.trusted_proxies)
    if await asyncio.to_thread(sessions.blocked, who):
        log.warning("%s login from %s refused: too many failed logins", what, who)
        raise web.HTTPTooManyRequests(text="too many failed logins; wait a few minutes")
    if hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode()):
        return True
    failures = await asyncio.to_thread(sessions.failed, who)
    log.warning("%s login from %s failed (%d in %d s)", what, who, failures, LOGIN_WINDOW)
    return False


def sessions_for(app: web.Application, runtime: Runtime) -> None:
    """The one session and failed-login store of an app, however many of its parts check the token."""
    if SESSIONS not in app:
        app[SESSIONS] = Sessions(runtime.redis, runtime.settings.admin_token or "")


async def _guard(request: web.Request) -> None:
    token = request.app[RUNTIME].settings.admin_token
    if not token:
        raise web.HTTPNotFound()
    if not await authorised(request, token):
        raise web.HTTPUnauthorized(text="admin token required", headers={"WWW-Authenticate": "Bearer"})


def client_address(request: web.Request, trusted: tuple[str, ...]) -> str:
    """Who is asking: the peer, or behind a trusted proxy the nearest X-Forwarded-For address that is not
    one (read right to left: a client can prepend anything, each proxy appends what it saw)."""
    peer = request.remote or "?"
    nets = [ipaddress.ip_network(n) for n in trusted]

    def proxy(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in nets)

    if not nets or not proxy(peer):
        return peer
    chain = ",".join(request.headers.getall("X-Forwarded-For", []))  # several headers: one list, in order
    try:
        text_header({"X-Forwarded-For": chain}, "X-Forwarded-For")
    except BadHeader as exc:
        raise web.HTTPBadRequest(text=str(exc)) from exc
    hops = [h.strip() for h in chain.split(",") if h.strip()]
    for hop in reversed(hops):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            return peer  # not an address: believe nothing further up the chain
        if not proxy(hop):
            return hop
    return hops[0] if hops else peer


def _https(request: web.Request) -> bool:
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.secure or forwarded == "https"


async def page(request: web.Request) -> web.StreamResponse:
    token = request.app[RUNTIME].settings.admin_token
    if not token:
        raise web.HTTPNotFound()
    given = request.query.get("token")
    if given is not None:
        runtime = request.app[RUNTIME]
        if not await token_guess(request, runtime, given, "viewer"):
            raise web.HTTPUnauthorized(text="wrong admin token")
        sid = await asyncio.to_thread(request.app[SESSIONS].open)
        log.info("viewer login from %s", client_address(request, runtime.settings.trusted_proxies))
        response = web.HTTPFound("/admin/viewer")
        response.set_cookie(
            COOKIE,
            sid,
            httponly=True,
            samesite="Strict",
            path="/admin",
            max_age=SESSION_TTL,
            secure=_https(request),
        )
        raise response
    await _guard(request)
    return web.Response(text=PAGE, content_type="text/html", headers=_SECURITY_HEADERS)


def _namespace_rows(runtime: Runtime, service: MemoryService) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ns in list_namespaces(runtime.settings.data_dir):
        try:
            book = service.book(ns)
        except LucidError as exc:  # e.g. a symbolic link in it: shown, not a 500 for the whole list
            out.append({"tenant": ns.tenant, "user": ns.user, "persona": ns.persona, "error": str(exc)})
            continue
        out.append(
            {
                "tenant": ns.tenant,
                "user": ns.user,
                "persona": ns.persona,
                "entries": len(book.entries()),
                "archived": len(book.archived()),
            }
        )
    return out


async def namespaces(request: web.Request) -> web.Response:
    await _guard(request)
    rows = await asyncio.to_thread(_namespace_rows, request.app[RUNTIME], request.app[SERVICE])
    return web.json_response({"namespaces": rows})


async def namespace(request: web.Request) -> web.Response:
    await _guard(request)
    runtime = request.app[RUNTIME]
    service = request.app[SERVICE]
    ns = Namespace.at(request.match_info["tenant"], request.match_info["user"], request.match_info["persona"])
    if not runtime.store.path(ns).is_dir():
        raise web.HTTPNotFound(text="no such namespace")
    try:
        data = await asyncio.to_thread(view, runtime, service, ns, request.query.get("q", ""))
    except LucidError as exc:
        return web.json_response({"error": str(exc)}, status=409)
    return web.json_response(data)


def view(runtime: Runtime, service: MemoryService, ns: Namespace, query: str = "") -> dict[str, Any]:
    """Everything the page shows about one namespace (also used by tests and the CLI)."""
    now = runtime.clock()
    runtime.writer.mend(ns)
    book = service.book(ns)
    current = book.current(now)

    def row(e: Any) -> dict[str, Any]:
        data = entry_to_json(e)
        data.update(
            recency=round(recency(e, now), 3), importance=round(importance(e), 3), current=e.current(now)
        )
        return data

    scored = {}
    if query.strip():
        scored = {s.entry.id: s for s in service.recall(ns, query, now, k=50)}  # the chat's own path
    recall_rows = []
    for e in current:
        if e.resident:
            continue
        r = row(e)
        s = scored.get(e.id)
        r["relevance"] = round(s.relevance, 3) if s else None
        r["score"] = round(s.score, 3) if s else round(r["recency"] + r["importance"], 3)
        recall_rows.append(r)
    recall_rows.sort(key=lambda r: -r["score"])
    timelines = {
        subject: [
            {
                "id": st.entry.id,
                "text": st.entry.text,
                "from": format_time(st.start) if st.start else None,
                "to": format_time(st.end) if st.end else None,
                "archived": st.archived,
                "current": st.entry.current(now) and not st.archived,
            }
            for st in steps
        ]
        for subject, steps in subject_timelines(book.entries(), book.archived()).items()
    }
    dreams = []
    held = {e.id for e in book.entries()} | {e.id for e in book.archived()}
    profile = service.profile(ns) or ""
    for commit in runtime.store.history(ns, limit=200):
        if commit["message"].startswith(("dream", "undo")):
            diff = held_diff(runtime.store.show(ns, commit["rev"]), held, profile)
            dreams.append({**commit, "diff": diff})
        if len(dreams) >= 20:
            break
    return {
        "namespace": str(ns),
        "now": format_time(now),
        "query": query,
        "resident": [row(e) for e in current if e.resident],
        "recall": recall_rows,
        "history": [row(e) for e in book.entries() if not e.current(now)],
        "archive": [row(e) for e in book.archived()],
        "profile": profile,
        "timelines": timelines,
        "journal": runtime.store.read_text(ns, DREAMS) or "",
        "dreams": dreams,
        "problems": [{"line": line, "problem": why} for line, why in book.problems()],
    }


def mount(app: web.Application, runtime: Runtime) -> None:
    app[RUNTIME] = runtime
    app[SERVICE] = runtime.memory
    sessions_for(app, runtime)
    app.router.add_get("/admin/viewer", page)
    app.router.add_get("/admin/api/namespaces", namespaces)
    app.router.add_get("/admin/api/ns/{tenant}/{user}/{persona}", namespace)


_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

PAGE = """<!doctype html>
<html lang="zh"><head><meta charset="utf-8"><title>Lucid · memory viewer</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font:14px/1.5 system-ui,-apple-system,"PingFang SC","Noto Sans CJK SC",sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
 header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:16px;align-items:center}
 header h1{font-size:16px;margin:0;font-weight:600} select,input{font:inherit;padding:4px 8px}
 main{display:grid;grid-template-columns:1fr 1fr;gap:16px;padding:16px 20px}
 section{background:#fff;border-radius:8px;padding:12px 16px;box-shadow:0 1px 2px rgba(0,0,0,.06)}
 section.wide{grid-column:1 / -1} h2{font-size:14px;margin:0 0 8px;color:#4a5568;text-transform:uppercase;letter-spacing:.04em}
 table{width:100%;border-collapse:collapse} td,th{padding:4px 6px;border-bottom:1px solid #edf0f3;text-align:left;vertical-align:top}
 th{font-weight:600;color:#718096;font-size:12px} .num{text-align:right;font-variant-numeric:tabular-nums;color:#4a5568}
 .tag{display:inline-block;font-size:11px;padding:0 6px;border-radius:9px;background:#edf2f7;color:#4a5568;margin-left:4px}
 .old{color:#a0aec0;text-decoration:line-through} .chain{display:flex;flex-wrap:wrap;align-items:center;gap:6px;margin:6px 0}
 .step{border:1px solid #cbd5e0;border-radius:6px;padding:4px 8px;background:#fff} .step.current{border-color:#2f855a;background:#f0fff4}
 .step small{display:block;color:#718096;font-size:11px} .arrow{color:#a0aec0}
 pre{white-space:pre-wrap;background:#f7fafc;padding:8px;border-radius:6px;font-size:12px;max-height:320px;overflow:auto}
 .empty{color:#a0aec0}
</style></head>
<body>
<header><h1>Lucid · memory viewer</h1><select id="ns" aria-label="namespace"></select>
<input id="q" placeholder="score against a query…" size="28"><span id="now" class="tag"></span></header>
<main>
 <section class="wide" id="timelines-box"><h2>Timeline per subject</h2><div id="timelines"></div></section>
 <section><h2>Resident</h2><table id="resident"></table></section>
 <section><h2>Recall</h2><table id="recall"></table></section>
 <section><h2>Profile</h2><pre id="profile"></pre></section>
 <section><h2>Archive &amp; history</h2><table id="archive"></table></section>
 <section class="wide"><h2>Dream journal</h2><div id="dreams"></div></section>
</main>
<script>
const $ = (id) => document.getElementById(id);
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined && text !== null) e.textContent = String(text); if (cls) e.className = cls; return e; }
function day(t) { return t ? t.slice(0, 10) : "…"; }
function table(id, rows, cols) {
  const t = $(id); t.replaceChildren();
  if (!rows.length) { const r = t.insertRow(); r.appendChild(el("td", "(none)", "empty")); return; }
  const h = t.insertRow(); cols.forEach(c => h.appendChild(el("th", c[0])));
  rows.forEach(r => { const tr = t.insertRow(); tr.dataset.id = r.id;
    cols.forEach(c => { const td = el("td", null, c[2] || ""); const v = c[1](r);
      if (v instanceof Node) td.appendChild(v); else td.textContent = v === null || v === undefined ? "" : String(v); tr.appendChild(td); }); });
}
function textCell(r) { const s = el("span", r.text, r.current === false ? "old" : ""); if (r.pinned) s.appendChild(el("span", "pinned", "tag"));
  if (r.subject) s.appendChild(el("span", r.subject, "tag")); return s; }
async function load() {
  const ns = $("ns").value; if (!ns) return;
  const res = await fetch("/admin/api/ns/" + ns + "?q=" + encodeURIComponent($("q").value), {credentials: "same-origin"});
  const d = await res.json();
  $("now").textContent = "now " + d.now;
  table("resident", d.resident, [["memory", textCell], ["type", r => r.type], ["hits", r => r.hits, "num"]]);
  table("recall", d.recall, [["memory", textCell], ["score", r => r.score.toFixed(2), "num"], ["rec", r => r.recency.toFixed(2), "num"],
    ["imp", r => r.importance.toFixed(2), "num"], ["rel", r => r.relevance === null ? "–" : r.relevance.toFixed(2), "num"]]);
  table("archive", d.history.concat(d.archive), [["memory", textCell], ["valid", r => day(r.valid_from || r.at) + " → " + day(r.valid_to)]]);
  $("profile").textContent = d.profile || "(no profile yet)";
  const tl = $("timelines"); tl.replaceChildren();
  const subjects = Object.keys(d.timelines);
  if (!subjects.length) tl.appendChild(el("p", "(no subjects yet)", "empty"));
  subjects.forEach(s => { const row = el("div", null, "chain"); row.dataset.subject = s; row.appendChild(el("strong", s));
    d.timelines[s].forEach((st, i) => { if (i) row.appendChild(el("span", "→", "arrow"));
      const b = el("span", st.text, "step" + (st.current ? " current" : "")); b.appendChild(el("small", day(st.from) + " – " + (st.to ? day(st.to) : "now")));
      row.appendChild(b); }); tl.appendChild(row); });
  const dr = $("dreams"); dr.replaceChildren();
  if (!d.dreams.length) dr.appendChild(el("p", "(no dream runs yet)", "empty"));
  d.dreams.forEach(x => { const det = document.createElement("details"); det.appendChild(el("summary", day(x.time) + "  " + x.message));
    det.appendChild(el("pre", x.diff)); dr.appendChild(det); });
}
async function init() {
  const res = await fetch("/admin/api/namespaces", {credentials: "same-origin"});
  const d = await res.json();
  d.namespaces.forEach(n => { const o = el("option", n.tenant + " / " + n.user + " / " + n.persona + "  (" + n.entries + ")");
    o.value = [n.tenant, n.user, n.persona].map(encodeURIComponent).join("/"); $("ns").appendChild(o); });
  $("ns").onchange = load; $("q").onchange = load; await load(); document.body.dataset.ready = "1";
}
init();
</script></body></html>
"""
