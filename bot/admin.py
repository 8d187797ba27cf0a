"""The HTTP admin API (`setup`): trigger a dream phase, read dream status and service stats, erase a person."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from bot import viewer
from bot.headers import text_header
from memory_core.errors import InvalidInput, LucidError
from memory_core.namespace import Namespace
from workers import commands, erasure
from workers.errors import BadHeader
from workers.runtime import Runtime

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.Response]]


def setup(app: web.Application, runtime: Runtime) -> None:
    """Mount the admin routes (docs/ARCHITECTURE.md, "The admin API"), none without LUCID_ADMIN_TOKEN:
    never open by omission. Each needs `Authorization: Bearer <token>`, compared in constant time."""
    token = runtime.settings.admin_token
    if not token:
        log.info("LUCID_ADMIN_TOKEN not set: the HTTP admin API is disabled")
        return
    viewer.sessions_for(app, runtime)  # the viewer's failed-login count: one limit for every way in

    def guarded(handler: Callable[[web.Request, Runtime], Awaitable[web.Response]]) -> Handler:
        async def check(request: web.Request) -> web.Response:
            try:
                given = text_header(request.headers, "Authorization")
            except BadHeader as exc:
                return web.json_response({"error": str(exc)}, status=400)
            try:
                ok = given.startswith("Bearer ") and await viewer.token_guess(
                    request, runtime, given[7:], "admin API"
                )
            except web.HTTPTooManyRequests as exc:
                return web.json_response({"error": exc.text}, status=429)
            if not ok:
                log.warning("admin %s %s refused: bad or missing token", request.method, request.path)
                return web.json_response(
                    {"error": "unauthorized"}, status=401, headers={"WWW-Authenticate": "Bearer"}
                )
            try:
                return await handler(request, runtime)
            except InvalidInput as exc:
                return web.json_response({"error": str(exc)}, status=400)
            except LucidError as exc:
                return web.json_response({"error": str(exc)}, status=409)

        return check

    app.router.add_post("/admin/dream", guarded(_dream))
    app.router.add_get("/admin/dream/status", guarded(_dream_status))
    app.router.add_get("/admin/stats", guarded(_stats))
    app.router.add_post("/admin/erase", guarded(_erase))


def _namespace(value: Any) -> Namespace:
    if not isinstance(value, str):
        raise web.HTTPBadRequest(text='{"error": "namespace (tenant/user/persona) is required"}')
    try:
        return Namespace.parse(value)
    except ValueError as exc:
        raise web.HTTPBadRequest(text='{"error": "namespace must be tenant/user/persona"}') from exc


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError as exc:
        raise web.HTTPBadRequest(text='{"error": "body must be JSON"}') from exc


async def _dream(request: web.Request, runtime: Runtime) -> web.Response:
    body = await _json(request)
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text='{"error": "body must be a JSON object"}')
    ns = _namespace(body.get("namespace"))
    phase, dry_run = str(body.get("phase") or "light"), bool(body.get("dry_run", False))
    job = await asyncio.to_thread(commands.dream, runtime, ns, phase, dry_run)
    log.warning("admin API: %s dream (dry=%s) for ns=%s: %s", phase, dry_run, ns.key, job.get("status"))
    return web.json_response({**job, "dry_run": dry_run}, status=202)


async def _dream_status(request: web.Request, runtime: Runtime) -> web.Response:
    ns = _namespace(request.query.get("namespace"))
    return web.json_response(await asyncio.to_thread(commands.dream_status, runtime, ns))


async def _stats(request: web.Request, runtime: Runtime) -> web.Response:
    raw = request.query.get("namespace")
    ns = _namespace(raw) if raw is not None else None
    return web.json_response(await asyncio.to_thread(commands.stats, runtime, ns))


async def _erase(request: web.Request, runtime: Runtime) -> web.Response:
    body = await _json(request)
    user, tenant = (body.get(k) if isinstance(body, dict) else None for k in ("user", "tenant"))
    if not isinstance(user, str) or not user.strip() or (tenant is not None and not isinstance(tenant, str)):
        raise web.HTTPBadRequest(text='{"error": "user (and optionally tenant) must be strings"}')
    report = await asyncio.to_thread(erasure.erase_user, runtime, user, tenant)
    log.warning("admin API: erased %d namespace(s) of a user", len(report.namespaces))
    return web.json_response(report.to_json(), status=200 if report.namespaces else 404)
