"""The rules every path shares: who may change and see a memory, the canonical subjects and the questions
asking for them, and the CJK ranges."""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .entry import Entry

#: Sources a person speaks through; every other source is automatic.
USER_SOURCES = frozenset({"user", "manual"})
#: Types no automatic path may change (besides pinned entries).
PROTECTED_TYPES = frozenset({"rule", "identity", "instruction"})
#: Types that live in the resident tier (in every prompt); `Entry.resident` adds pinned and promoted entries.
RESIDENT_TYPES = frozenset({"rule", "identity", "instruction", "preference"})
#: Types of a private entry a group may see: standing rules and instructions on how to answer (`visible_in`).
GROUP_STANDING_TYPES = frozenset({"rule", "instruction"})

#: What an automatic path is told when it reaches for a protected entry; the model relays it to the user.
REFUSAL = (
    "This memory is protected (pinned, a rule, an identity or a standing instruction): only the person can "
    "change or delete it themselves, with /forget, /unpin or by editing MEMORY.md. Tell them so; it was left "
    "unchanged."
)


def protected(e: Entry) -> bool:
    """Pinned entries, rules, identities and instructions: changed by the person only."""
    return e.pinned or e.type in PROTECTED_TYPES


def scope_key(scope: str | None) -> str:
    """Where a statement was learned: `g:<chat>` for a group, else "p2p" (unscoped is private). What was
    learned in one never merges with, updates or rewords what was learned in another."""
    return scope if scope and scope != "p2p" else "p2p"


def automatic(source: str | None) -> bool:
    return source not in USER_SOURCES


def may_change(e: Entry, source: str | None) -> bool:
    """Whether `source` may rewrite, supersede or delete `e`."""
    return not (automatic(source) and protected(e))


# --- CJK ranges, as regex character-class bodies (`rf"[{HAN}]"`) ------------------------------------

#: Han ideographs: Extension A, the unified block, the compatibility block.
HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
#: Hiragana and katakana (n-grammed with Han by the text indexes).
KANA = "\u3040-\u30ff"
#: Characters a tokenizer spends about one token on: CJK symbols, kana, Han, Hangul, full-width forms.
WIDE = "\u3000-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"

#: The canonical subjects: standing attributes with one current value each, whatever their spelling.
CANONICAL = ("所在地", "雇主", "姓名", "时区", "语言", "技术栈", "家乡", "职业", "生日")

# Alias spellings per canonical key; matched after `_fold` and `_alias_key`.
_ALIASES = {
    "所在地": "location|residence|city|current city|current location|lives in|living in|based in|home city|"
    "address|居住地|住址|住处|地址|所在城市|居住城市|城市|常住地|位置|所在位置|坐标",
    "雇主": "employer|company|current employer|workplace|works at|works for|organization|organisation|"
    "公司|单位|工作单位|东家|就职单位|所在公司|任职公司",
    "姓名": "name|full name|preferred name|display name|user name|名字|姓名|称呼|全名",
    "时区": "timezone|time zone|tz|utc offset|时区",
    "语言": "language|preferred language|reply language|lang|语言|偏好语言|回复语言|沟通语言|首选语言",
    "技术栈": "tech stack|stack|technology stack|programming language|programming languages|技术栈|编程语言|开发语言",
    "家乡": "hometown|home town|origin|place of origin|家乡|老家|籍贯",
    "职业": "occupation|job|job title|profession|role|职业|职位|岗位|工作岗位",
    "生日": "birthday|date of birth|dob|birth date|生日|出生日期",
}
_TYPE = {"姓名": "identity", "语言": "preference"}

_ASCII_UPPER = re.compile(r"[A-Z]+")


def _fold(text: str, *, lower: bool = True) -> str:
    """NFKC, collapsed white space, ASCII lower case; repeated to a fixed point so that folding is idempotent."""
    for _ in range(8):
        folded = " ".join(unicodedata.normalize("NFKC", text).split())
        if lower:
            folded = _ASCII_UPPER.sub(lambda m: m.group().lower(), folded)
        if folded == text:
            break
        text = folded
    return text


def _alias_key(text: str) -> str:
    return " ".join(re.sub(r"[_\-]+", " ", text).split())


_ALIAS = {
    _alias_key(_fold(a)): canon for canon, spelt in _ALIASES.items() for a in (canon, *spelt.split("|"))
}


def canonical_subject(subject: str) -> str:
    """Map a subject to its canonical key so that model-given and rule-given subjects compare equal."""
    kept = _fold(subject, lower=False)
    head, colon, name = kept.partition(":")
    if colon and _fold(head) in ("person", "人物", "人"):
        return "person:" + name.strip()
    folded = _fold(subject)
    return _ALIAS.get(_alias_key(folded), folded)


#: Short questions about a standing attribute, answered by the entries holding that subject.
_SUBJECT_QUESTIONS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.I), subject)
    for subject, pattern in (
        (
            "雇主",
            r"(哪|什么).{0,4}(工作|上班|公司|单位)|在哪里?.{0,2}(工作|上班|任职)|where do i work|"
            r"who do i work for|my (employer|company)",
        ),
        ("家乡", r"老家|家乡|籍贯|hometown|where am i from"),
        (
            "所在地",
            r"我(现在)?(在|住|人在)(哪|什么地方)|(在|住)(在)?哪|住址|所在地|在哪儿|"
            r"where (do|am) i( now)?( live| living| based)?\b|where i live|my (location|city|address)",
        ),
        ("姓名", r"我叫什么|我的名字|叫我什么|what'?s my name|what is my name|who am i"),
        ("时区", r"时区|time ?zone"),
        ("语言", r"(用|说)什么语言|哪种语言|which language|what language"),
        ("生日", r"生日|birthday"),
        ("技术栈", r"技术栈|tech stack|my stack"),
        ("职业", r"我(是做什么|的职业|的工作是)|what do i do|my job"),
    )
)


def asked_subject(query: str) -> str | None:
    """The standing attribute a short question asks about (我在哪 → 所在地), if any."""
    for pattern, subject in _SUBJECT_QUESTIONS:
        if pattern.search(query):
            return subject
    return None


def subject_key(subject: str | None) -> str | None:
    """The key two subjects are compared by (`canonical_subject`), None for an entry without one."""
    return canonical_subject(subject) or None if subject else None


def subject_type(subject: str) -> str:
    """The entry type a subject implies: a name is an identity, a reply language a preference, else a fact."""
    return _TYPE.get(canonical_subject(subject), "fact")
