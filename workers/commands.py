"""Commands (/help, /memory, /forget, /pin, /dream …, with Chinese aliases), the memory-only replies, the
`manage_memory` tool, and the admin actions they share with the HTTP admin API."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from memory_core.dream import PHASES
from memory_core.entry import MAX_SUBJECT_CHARS, TYPES, Entry
from memory_core.errors import LucidError
from memory_core.injection import carries_instruction
from memory_core.intents import (
    asks_about_me,
    classify_type,
    is_conversational,
    is_durable_statement,
    is_memorable,
    parse_intent,
)
from memory_core.lineformat import reply_id
from memory_core.namespace import Namespace
from memory_core.ops import Edit, Forget, Kind, Op, Outcome, Pin, Remember, Share
from memory_core.policy import HAN, REFUSAL, RESIDENT_TYPES, asked_subject, subject_key
from memory_core.recall import visible_in
from memory_core.store import DREAMS
from memory_core.subjects import recognise

from . import dreaming
from .inbound import Inbound
from .memory_card import visible_entries
from .memory_service import Assembly, MemoryService, statement
from .runtime import Runtime
from .settings import Persona

log = logging.getLogger(__name__)


def dream(runtime: Runtime, ns: Namespace, phase: str, dry_run: bool = False) -> dict[str, Any]:
    """Queue one dream phase for `ns` (the /dream command and the admin API): {"status", "job_id", …}."""
    return dreaming.enqueue_phase(runtime, ns, phase, dry_run)


def stats(runtime: Runtime, ns: Namespace | None = None) -> dict[str, Any]:
    """Queue depths, model usage and (with `ns`) that namespace's memory counts."""
    out: dict[str, Any] = {"queues": {}, "model": None}
    if runtime.redis is not None:
        for name in ("chat", "memory", "dream"):
            q = runtime.queue(name)
            out["queues"][name] = {"queued": q.count, "failed": q.failed_job_registry.count}
    if runtime.llm is not None:
        usage = runtime.llm.usage
        out["model"] = {"calls": usage.calls, "tokens": usage.tokens, "failures": usage.failures}
    if ns is not None:
        book = runtime.memory.book(ns)
        now = runtime.clock()
        current_entries = book.current(now)
        out["memory"] = {
            "namespace": str(ns),
            "current": len(current_entries),
            "resident": sum(1 for e in current_entries if e.resident),
            "history": len(book.entries()) - len(current_entries),
            "archived": len(book.archived()),
        }
    return out


# Every sentence the bot says without a model, in Chinese and English: (zh, en) format strings.
_T = {
    "error": (
        "抱歉，我这边出了点问题，请稍后再试。",
        "Sorry, something went wrong on my side. Please try again.",
    ),
    # the placeholder text of an image carries no language: say it both ways
    "unreadable": (
        "我还读不了{what}，只记下了收到过它。请用文字告诉我要点。"
        " (I can't read {what_en} yet; I noted that it came. Please tell me in words.)",
        "我还读不了{what}，只记下了收到过它。请用文字告诉我要点。"
        " (I can't read {what_en} yet; I noted that it came. Please tell me in words.)",
    ),
    "admin_only": ("这个命令只有管理员可以使用。", "Only an admin can use this command."),
    "profile_private": ("画像只在私聊里显示。", "Your profile is shown in a private chat only."),
    "no_profile": (
        "还没有画像：聊得多了，做梦时会整理出来。",
        "No profile yet; dreaming distils one over time.",
    ),
    "persona": (
        "当前人格：{name}；对话模型：{model}。已配置的人格：{names}（每个人格是一个飞书应用）。",
        "Persona: {name}; chat model: {model}. Personas: {names} (one Feishu app each).",
    ),
    "no_model_name": ("未配置（仅记忆模式）", "none (memory-only mode)"),
    "help": (
        "我会记住你告诉我的事。可以直接说“记住……”“以后……”“忘掉……”，或者用命令：",
        "I remember what you tell me. Say “remember …”, “from now on …”, “forget …”, or use a command:",
    ),
    "empty": ("我还没有记住关于你的任何事。", "I don't remember anything about you yet."),
    "listing": ("我记得关于你的 {n} 件事：", "I remember {n} things about you:"),
    "group_listing": (
        "（群聊里只显示你的回答要求、你分享过的，以及在本群学到的；私聊里的其余记忆不在这里显示）",
        "(in a group: your instructions, what you shared, and what I learned here; the rest stays private)",
    ),
    "nomem": (
        "好的，这句我不记，也不会用到记忆。",
        "Okay: I won't remember this one, and I didn't use memory for it.",
    ),
    "not_learning": (
        "这个聊天的记忆已关闭，所以我没有记下来（发 /memory on 重新开启）。",
        "Memory is off in this chat, so I didn't store that (send /memory on to turn it back on).",
    ),
    "memory_off": (
        "好的，从现在起我不再从这个聊天里学习新记忆（已有的记忆不变；/memory on 恢复）。",
        "Okay: from now on I learn nothing from this chat (existing memory stays; /memory on resumes).",
    ),
    "memory_on": ("好的，这个聊天的记忆已重新开启。", "Okay, memory is back on in this chat."),
    "memory_is_off": (
        "（这个聊天的记忆目前是关闭的：/memory on 开启）",
        "(memory is off in this chat: /memory on)",
    ),
    "shared": ("已分享到你的群聊：{text}", "Shared with your groups: {text}"),
    "unshared": ("已取消分享：{text}", "No longer shared with your groups: {text}"),
    "more": ("……还有 {n} 条", "… and {n} more"),
    "list_hint": ("用 /forget 编号 删除，/pin 编号 置顶。", "Use /forget ID to delete, /pin ID to pin."),
    "which": ("是哪一条？用 /{verb} 编号 指定：", "Which one? Use /{verb} ID:"),
    "forget_what": ("要忘掉哪一条？发 /memory 查看编号。", "Forget which one? Send /memory to see the ids."),
    "usage": ("用法：/{verb} 编号或文字", "Usage: /{verb} ID or text"),
    "not_found": ("我没有找到和“{target}”有关的记忆。", "I found no memory matching “{target}”."),
    "failed": ("没能完成：{why}", "Could not do that: {why}"),
    "forgotten": ("好的，已忘掉：{text} [{id}]", "Done, forgotten: {text} [{id}]"),
    "pinned": ("已置顶：{text}", "Pinned: {text}"),
    "unpinned": ("已取消置顶：{text}", "Unpinned: {text}"),
    "you": ("你", "you"),
    "no_dreams": ("{who} 还没有做过梦。", "No dreams yet for {who}."),
    "dream_failed": ("没能安排做梦：{why}", "Could not schedule the dream: {why}"),
    "dream_queued": ("已为 {who} 安排 {phase} 做梦{dry}。", "Queued a {phase} dream for {who}{dry}."),
    "dry": ("（试运行）", " (dry run)"),
    "dream_already": ("（已经在队列里了）", " (it was already queued)"),
    "remembered": ("好的，我记住了：{text}", "Got it, I'll remember: {text}"),
    "superseded": (
        "好的，已更新：{text}（之前的记录保留为历史）",
        "Got it, updated: {text} (the old one is kept as history)",
    ),
    "known": ("这个我已经记得了：{text}", "I already remember that: {text}"),
    "secret": (
        "这看起来像密码或密钥，为了安全我不会保存它。",
        "That looks like a password or key, so I won't store it.",
    ),
    "protected": (
        "这和一条置顶的记忆冲突，我没有改动；需要的话先 /unpin。",
        "That conflicts with a pinned memory, so I left it alone; /unpin it first.",
    ),
    "noted": ("好的，记下了。", "Okay, noted."),
    "okay": ("好的。", "Okay."),
    "recalled": ("根据我的记忆：{text}", "From what I remember: {text}"),
    "recalled_many": ("我记得：\n{lines}", "I remember:\n{lines}"),
    "unknown": (
        "这个我还不知道。你可以告诉我，比如：记住……",
        "I don't know that yet. You can tell me: remember …",
    ),
    "hello": ("你好！", "Hi!"),
    "not_stored": (
        "我没有把这句存为记忆（它不像一条长期的信息）。要我记住的话，说“记住……”。",
        "I haven't stored that (it doesn't read as something lasting). Say “remember …” if you want me to keep it.",
    ),
    "busy": (
        "你发消息比我回得快，我会按顺序一条条回复，请稍等。",
        "You're sending messages faster than I can answer; I'll get to them in order.",
    ),
    "no_model": (
        "（提示：还没有配置对话模型，我现在只能帮你记住、忘掉和查询记忆。）",
        "(No chat model is configured, so for now I can only remember, forget and look things up.)",
    ),
    "cut": (
        "（你的消息有 {sent} 个字，太长了：我只读了前 {read} 个字，后面的没有读到，也没有记下。）",
        "(Your message was {sent} characters long, too long: I read only the first {read}; the rest was not"
        " read or kept.)",
    ),
    "model_down": (
        "（对话模型暂时不可用，这是根据记忆给出的回答。）",
        "(The chat model is unavailable right now; this answer comes from memory only.)",
    ),
}
_HAN = re.compile(f"[{HAN}]")
_LATIN = re.compile(r"[A-Za-z]*[G-Zg-z][A-Za-z]*")  # a word, not a hex id such as 4ca67195


def language_of(text: str) -> str | None:
    """ "zh" for text with Chinese, "en" for Latin words without, None when it says nothing (/memory, 👍)."""
    body = re.sub(r"^[/／]\S*", "", text.strip())
    if _HAN.search(body):
        return "zh"
    return "en" if _LATIN.search(body) else None


def language(inbound: Inbound) -> str:
    """The message's language, else the conversation's (`Inbound.lang`: /memory in an English
    conversation answers in English), else Chinese."""
    return language_of(inbound.text) or inbound.lang or "zh"


def say(inbound: Inbound, key: str, **values: Any) -> str:
    """A catalogue sentence in the message's (or the conversation's) language."""
    zh, en = _T[key]
    return (en if language(inbound) == "en" else zh).format(**values)


_ALIASES = {
    "help": ("help", "h", "帮助"),
    "memory": ("memory", "mem", "记忆"),
    "forget": ("forget", "忘记", "忘掉"),
    "pin": ("pin", "置顶"),
    "unpin": ("unpin", "取消置顶"),
    "share": ("share", "分享", "共享"),
    "unshare": ("unshare", "取消分享"),
    "profile": ("profile", "画像"),
    "dream": ("dream", "做梦"),
    "stats": ("stats", "状态", "统计"),
    "persona": ("persona", "人格", "角色"),
    "whoami": ("whoami",),
}
_BY_WORD = {alias: name for name, aliases in _ALIASES.items() for alias in aliases}
ADMIN_COMMANDS = frozenset({"dream", "stats"})
_SWITCH_WORDS = {"off": "off", "关": "off", "关闭": "off", "on": "on", "开": "on", "开启": "on", "打开": "on"}
_PHASE_WORDS = {**{p: p for p in PHASES}, "浅": "light", "深": "deep", "回放": "replay"}
_HELP = (
    "/memory 记忆 — 查看我记得的 · what I remember",
    "/memory off|on — 这个聊天停止/恢复学习（群里仅管理员） · stop/resume learning here (admins in groups)",
    "/nomem …、这句别记 — 这一句不用也不记记忆 · this message: no memory at all",
    "/forget 忘记 <编号|文字> — 删除一条 · delete one",
    "/pin 置顶 <编号|文字>, /unpin — 一直生效 · always keep in mind",
    "/share 分享 <编号>, /unshare — 私聊记忆也给群聊看 · show a private memory in your groups",
    "/profile 画像 — 你的画像 · your profile",
    "/persona 人格 — 当前人格和模型 · persona and model",
    "/whoami — open_id",
)
_ADMIN_HELP = (
    "/dream 做梦 [light|deep|replay|profile] [@某人] [dry] — 整理记忆 · tidy memory",
    "/dream status — 做梦记录 · dream journal",
    "/stats 状态 — 运行统计 · service stats",
)
LIST_LIMIT = 30


def is_admin(persona: Persona, inbound: Inbound) -> bool:
    """Fail closed: an empty admin list means nobody; ids are the sender's open_id (or union_id)."""
    return bool(persona.admins) and (inbound.open_id in persona.admins or inbound.user in persona.admins)


def parse_command(text: str) -> tuple[str, str] | None:
    """`/name args` (any alias, also with a full-width slash) or a Chinese alias as the first word."""
    t = text.strip()
    slash = t[:1] in ("/", "／")
    parts = (t[1:] if slash else t).split(maxsplit=1)
    if not parts:
        return ("help", "") if slash else None
    word, rest = parts[0], parts[1].strip() if len(parts) > 1 else ""
    name = _BY_WORD.get(word.lower())
    if slash:
        return (name, rest) if name else ("help", "")
    return (name, rest) if name and _HAN.match(word) else None


def run_command(
    runtime: Runtime, mem: MemoryService, persona: Persona, inbound: Inbound, name: str, args: str
) -> str:
    if name in ADMIN_COMMANDS:
        allowed = is_admin(persona, inbound)
        log.warning(
            "admin command /%s %s: open_id=%s chat=%s message=%s",
            name, "run" if allowed else "refused", inbound.open_id, inbound.chat_id, inbound.message_id,
        )  # fmt: skip
        if not allowed:
            return say(inbound, "admin_only")
    if name == "memory":
        switch = _SWITCH_WORDS.get(args.strip().lower())
        if switch is None:
            return _list_memory(runtime, mem, inbound)
        if inbound.group and not is_admin(persona, inbound):
            return say(inbound, "admin_only")
        runtime.switch.turn(inbound.tenant, inbound.persona, inbound.chat_id, off=switch == "off")
        log.warning("memory %s in chat=%s by open_id=%s", switch, inbound.chat_id, inbound.open_id)
        return say(inbound, f"memory_{switch}")
    if name == "forget":
        return _forget(runtime, mem, inbound, args, [])
    if name in ("pin", "unpin"):
        return _pin(runtime, mem, inbound, args, name == "pin")
    if name in ("share", "unshare"):
        return _share(runtime, mem, inbound, args, name == "share")
    if name == "profile":
        if inbound.group:
            return say(inbound, "profile_private")
        return (mem.profile(inbound.ns) or "").strip() or say(inbound, "no_profile")
    if name == "persona":
        model = persona.chat_model or runtime.settings.chat_model or say(inbound, "no_model_name")
        names = ", ".join(sorted(runtime.settings.personas)) or persona.name
        return say(inbound, "persona", name=persona.name, model=model, names=names)
    if name == "whoami":
        return f"open_id: {inbound.open_id}\nuser: {inbound.user}\nadmin: {is_admin(persona, inbound)}"
    if name == "dream":
        return _dream_command(runtime, inbound, args)
    if name == "stats":
        return json.dumps(stats(runtime, inbound.ns), ensure_ascii=False, indent=1)
    extra = _ADMIN_HELP if is_admin(persona, inbound) else ()
    return "\n".join([say(inbound, "help"), *_HELP, *extra])


def _visible(inbound: Inbound, entries: Sequence[Entry]) -> list[Entry]:
    """Group scope for everything a command shows or touches: in a group, private facts do not exist."""
    return [e for e in entries if visible_in(e, inbound.chat_type, inbound.chat_id)]


def _list_memory(runtime: Runtime, mem: MemoryService, inbound: Inbound) -> str:
    ordered = visible_entries(runtime, inbound.ns, inbound.chat_type, inbound.chat_id)
    off = runtime.switch.state(inbound.tenant, inbound.persona, inbound.chat_id).off
    if not ordered:
        return say(inbound, "empty") + ("\n" + say(inbound, "memory_is_off") if off else "")
    lines = [say(inbound, "listing", n=len(ordered))]
    if inbound.group:
        lines.append(say(inbound, "group_listing"))
    lines += [f"- [{e.id[:8]}] {e.text}{' 📌' if e.pinned else ''}" for e in ordered[:LIST_LIMIT]]
    if len(ordered) > LIST_LIMIT:
        lines.append(say(inbound, "more", n=len(ordered) - LIST_LIMIT))
    lines.append(say(inbound, "list_hint"))
    if off:
        lines.append(say(inbound, "memory_is_off"))
    return "\n".join(lines)


def _targets(runtime: Runtime, mem: MemoryService, inbound: Inbound, target: str) -> tuple[list[Entry], bool]:
    """(entries, exact): an id or text match; else the best recall hits, offered for confirmation only."""
    found = _visible(inbound, mem.find(inbound.ns, target))
    if found:
        return found, True
    now, ct, chat = runtime.clock(), inbound.chat_type, inbound.chat_id
    hits = mem.recall(inbound.ns, target, now, k=3, chat_type=ct, chat=chat, gate=False)
    return [s.entry for s in hits], False


def _resolve(runtime: Runtime, mem: MemoryService, inbound: Inbound, target: str, verb: str) -> Entry | str:
    """The one entry `target` names, or the sentence to send instead (not found, or which one?)."""
    if not target.strip():
        return say(inbound, "forget_what" if verb == "forget" else "usage", verb=verb)
    entries, exact = _targets(runtime, mem, inbound, target)
    if not entries:
        return say(inbound, "not_found", target=target)
    if len(entries) > 1 or not exact:  # never guess which memory to change
        return "\n".join(
            [say(inbound, "which", verb=verb)] + [f"- [{e.id[:8]}] {e.text}" for e in entries[:8]]
        )
    return entries[0]


def _forget(
    runtime: Runtime, mem: MemoryService, inbound: Inbound, target: str, outcomes: list[Outcome]
) -> str:
    """The one forget: the /forget command and 忘掉… in memory-only mode."""
    entry = _resolve(runtime, mem, inbound, target, "forget")
    if isinstance(entry, str):
        return entry
    outcome = mem.apply(inbound.ns, [Forget(id=entry.id)])[0]
    outcomes.append(outcome)
    if not outcome.ok:
        return say(inbound, "failed", why=outcome.detail or outcome.status)
    return say(inbound, "forgotten", text=entry.text, id=entry.id[:8])  # the id `forget --purge` takes


def _pin(runtime: Runtime, mem: MemoryService, inbound: Inbound, target: str, pinned: bool) -> str:
    entry = _resolve(runtime, mem, inbound, target, "pin" if pinned else "unpin")
    if isinstance(entry, str):
        return entry
    if pinned and (why := _pin_refusal(runtime, mem, inbound, entry)):
        return say(inbound, "failed", why=why)
    outcome = mem.apply(inbound.ns, [Pin(id=entry.id, pinned=pinned)])[0]
    if not outcome.ok:
        return say(inbound, "failed", why=outcome.detail or outcome.status)
    return say(inbound, "pinned" if pinned else "unpinned", text=entry.text)


def _pin_refusal(runtime: Runtime, mem: MemoryService, inbound: Inbound, entry: Entry) -> str | None:
    return mem.pin_refusal(inbound.ns, entry)


def _share_target(
    runtime: Runtime, mem: MemoryService, inbound: Inbound, target: str, verb: str
) -> Entry | str:
    """What /share names: in a private chat any entry (id or text); in a group only an exact id, so
    that probing by words never reveals a private memory there, and /unshare only what this group sees
    (its answer quotes the entry)."""
    if not inbound.group:
        return _resolve(runtime, mem, inbound, target, verb)
    found = [e for e in mem.find(inbound.ns, target) if target.strip() and e.id.startswith(target.strip())]
    if verb == "unshare":
        found = [e for e in found if visible_in(e, inbound.chat_type, inbound.chat_id)]
    if len(found) != 1:
        return say(inbound, "usage", verb=verb)
    return found[0]


def _share(runtime: Runtime, mem: MemoryService, inbound: Inbound, target: str, shared: bool) -> str:
    entry = _share_target(runtime, mem, inbound, target, "share" if shared else "unshare")
    if isinstance(entry, str):
        return entry
    outcome = mem.apply(inbound.ns, [Share(id=entry.id, shared=shared)])[0]
    if not outcome.ok:
        return say(inbound, "failed", why=outcome.detail or outcome.status)
    return say(inbound, "shared" if shared else "unshared", text=entry.text)


def _dream_command(runtime: Runtime, inbound: Inbound, args: str) -> str:
    words = [w.lower() for w in args.split()]
    target = inbound.mentions[0] if inbound.mentions else None
    ns = Namespace.of(inbound.tenant, target.user, inbound.persona) if target else inbound.ns
    who = f"@{target.name}" if target else say(inbound, "you")
    if words and words[0] in ("status", "状态"):
        return dream_status(runtime, ns)["journal"] or say(inbound, "no_dreams", who=who)
    phase = next((_PHASE_WORDS[w] for w in words if w in _PHASE_WORDS), "light")
    dry = any(w in ("dry", "dry-run", "--dry-run", "试运行") for w in words)
    try:
        job = dream(runtime, ns, phase, dry)
    except LucidError as exc:
        return say(inbound, "dream_failed", why=exc)
    log.warning(
        "dream %s (dry=%s) for ns=%s by open_id=%s: %s", phase, dry, ns.key, inbound.open_id, job["status"]
    )
    state = say(inbound, "dream_already") if job["status"] != "queued" else ""
    return say(inbound, "dream_queued", who=who, phase=phase, dry=say(inbound, "dry") if dry else "") + state


def dream_status(runtime: Runtime, ns: Namespace, lines: int = 20) -> dict[str, Any]:
    """Last run of each phase, the newest DREAMS.md entries (newest first by design), the queue depth."""
    text = runtime.store.read_text(ns, DREAMS) or ""
    return {
        "namespace": str(ns),
        "last_run": {phase: dreaming.last_run(runtime, ns, phase) for phase in PHASES},
        "journal": "\n".join(text.strip().splitlines()[:lines]),
        "queued": runtime.queue("dream").count if runtime.redis is not None else 0,
    }


def remember_op(text: str, inbound: Inbound, source: str = "user") -> Remember:
    return statement(text, source=source, origin=inbound.message_id, scope=inbound.scope)


def deterministic_intent(text: str) -> tuple[str, str]:
    """`intents.parse_intent`, with a statement setting a known attribute or a lasting identity, preference
    or instruction counted as "remember": the one rule of memory-only mode and the model's safety net."""
    intent = parse_intent(text)
    if intent.kind == "statement":
        standing = (
            is_memorable(intent.text)
            and classify_type(intent.text) in RESIDENT_TYPES
            and not is_conversational(intent.text)
        )
        if standing or recognise(intent.text) is not None or is_durable_statement(intent.text):
            return "remember", intent.text
    return intent.kind, intent.text


def memory_reply(
    runtime: Runtime,
    mem: MemoryService,
    inbound: Inbound,
    assembly: Assembly,
    note: str,
    outcomes: list[Outcome],
    learning: bool = True,
) -> str:
    """The answer without a model: explicit requests deterministically, questions from memory. It says
    it stored something only when the write succeeded, and what; a remark it did not store, it says so."""
    if asks_about_me(inbound.text):
        return _list_memory(runtime, mem, inbound) + "\n" + say(inbound, note)
    kind, payload = deterministic_intent(inbound.text)
    if kind == "remember" and not learning:
        text = say(inbound, "not_learning")
    elif kind == "remember":
        outcome = mem.apply(inbound.ns, [remember_op(payload, inbound)])[0]
        outcomes.append(outcome)
        key = {
            "added": "remembered",
            "updated": "remembered",
            "superseded": "superseded",
            "unchanged": "known",
        }
        text = say(inbound, key[outcome.kind], text=payload) if outcome.ok else _refusal(inbound, outcome)
    elif kind == "forget":
        text = _forget(runtime, mem, inbound, payload, outcomes)
    elif kind == "question":
        text = _answer(runtime, mem, inbound, assembly)
    else:
        text = say(inbound, "hello" if kind == "chitchat" else "not_stored")
    if note == "model_down" or kind not in ("remember", "forget"):
        text += "\n" + say(inbound, note)
    return text


def _refusal(inbound: Inbound, outcome: Outcome) -> str:
    if outcome.kind is Kind.REJECTED and outcome.why in ("secret", "protected"):
        return say(inbound, str(outcome.why))
    return say(inbound, "failed", why=outcome.detail or outcome.status)


def confirm(inbound: Inbound, outcomes: Sequence[Outcome]) -> str:
    """What to say when the model changed memory but wrote no text itself."""
    refused = [o for o in outcomes if not o.ok]
    if refused:
        return _refusal(inbound, refused[0])
    return say(inbound, "noted" if outcomes else "okay")


def _answer(runtime: Runtime, mem: MemoryService, inbound: Inbound, assembly: Assembly) -> str:
    """A question without a model, from the turn's recall (the one path `lucid recall` and the viewer
    use): the current value of the attribute asked about (我住在哪), else the best few entries."""
    subject = asked_subject(inbound.text)
    holder = next(
        (
            s.entry
            for s in assembly.recalled
            if subject is not None and subject_key(s.entry.subject) == subject
        ),
        None,
    )
    if holder is not None:
        return say(inbound, "recalled", text=holder.text)
    if assembly.recalled:
        return say(
            inbound, "recalled_many", lines="\n".join(f"- {s.entry.text}" for s in assembly.recalled[:3])
        )
    return say(inbound, "unknown")


SEARCH_LINE_CHARS = 300


def session_search(mem: MemoryService, inbound: Inbound, args: dict[str, Any]) -> dict[str, Any]:
    """Answer the model's `session_search`: this person's earlier one-to-one lines (never in a group)."""
    if inbound.group:
        return {"error": "session_search is only available in a private chat"}
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        return {"error": "session_search needs a query"}
    limit = args.get("limit")
    k = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else 5
    hits = mem.search_conversations(
        inbound.ns, query.strip()[:500], k=k, exclude=(inbound.message_id, reply_id(inbound.message_id))
    )
    return {
        "results": [
            {
                "date": f"{h.ts:%Y-%m-%d %H:%M}",
                "speaker": h.speaker,
                "text": h.text if len(h.text) <= SEARCH_LINE_CHARS else h.text[:SEARCH_LINE_CHARS] + "…",
            }
            for h in hits
        ]
    }


def tool_call(
    mem: MemoryService,
    runtime: Runtime,
    inbound: Inbound,
    name: str,
    args: dict[str, Any],
    outcomes: list[Outcome],
    generation: int | None = None,
) -> dict[str, Any]:
    """Validate one `manage_memory` call and run it through the writer; the answer goes back to the model."""
    if name == "session_search":
        return session_search(mem, inbound, args)
    if name != "manage_memory":
        return {"error": f"unknown tool {name!r}"}
    action = str(args.get("action") or "").strip().lower()
    text, target = (
        v.strip() if isinstance(v, str) else ""
        for v in (args.get("text"), args.get("target") or args.get("id"))
    )
    switch = runtime.switch
    if action in ("add", "update", "share") and not switch.learning(
        inbound.tenant, inbound.persona, inbound.chat_id, generation
    ):
        return {"error": "memory is off in this chat: nothing may be added or changed (forget still works)"}
    op: Op
    if action == "add":
        if not text:
            return {"error": "add needs text"}
        op = remember_op(text, inbound, source="tool")
        kind, subject = args.get("type"), args.get("subject")
        if isinstance(kind, str) and kind in TYPES and kind != "rule":
            op = replace(op, type=kind)
        if isinstance(subject, str) and 0 < len(subject.strip()) <= MAX_SUBJECT_CHARS:
            op = replace(op, subject=subject.strip())
    elif action == "share":
        found = _share_target(runtime, mem, inbound, target or text, "share")
        if isinstance(found, str):
            return {"error": "share needs the id of exactly one memory"}
        op = Share(found.id, source="tool")
    elif action in ("update", "forget", "pin"):
        target = target or ("" if action == "update" else text)
        if not target or (action == "update" and not text):
            return {
                "error": f"{action} needs a target (an id or words from the memory)"
                + (" and text" * (action == "update"))
            }
        entries, exact = _targets(runtime, mem, inbound, target)
        if len(entries) != 1 or not exact:
            return {
                "error": "no single memory matches",
                "candidates": [{"id": e.id, "text": e.text} for e in entries[:5]],
            }
        ident = entries[0].id
        if action == "pin" and carries_instruction(entries[0].text):
            return {"error": "this memory reads as an order to the assistant: only the person can pin it"}
        if action == "pin" and (why := _pin_refusal(runtime, mem, inbound, entries[0])):
            return {"error": why}
        op = (
            Edit(ident, text, "tool", scope=inbound.scope)
            if action == "update"
            else Forget(ident, source="tool")
            if action == "forget"
            else Pin(ident)
        )
    else:
        return {"error": "action must be add, update, forget, pin or share"}
    outcome = mem.apply(inbound.ns, [op])[0]
    outcomes.append(outcome)
    if outcome.status == "rejected:protected":  # the model relays this; only the person can change it
        return {"status": outcome.status, "id": outcome.id, "error": outcome.detail or REFUSAL}
    answer: dict[str, Any] = {"status": outcome.status, "id": outcome.id, "detail": outcome.detail}
    if args.get("share") in (True, "true") and action in ("add", "update") and outcome.ok and outcome.id:
        shared = mem.apply(inbound.ns, [Share(outcome.id, source="tool")])[0]
        outcomes.append(shared)
        answer["share"] = {"status": shared.status, "detail": shared.detail}
    return answer
