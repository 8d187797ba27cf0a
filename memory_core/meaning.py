"""Whether two statements say the same thing, or one changes the other: the upsert's deterministic judge
(`compare`)."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from . import similarity
from .policy import HAN
from .subjects import EN_PLACES, ZH_PLACES, recognise

SAME_FRAME = 0.75  # frames at least this alike are one statement pattern
CANDIDATE = 0.4  # core-bigram Jaccard at which an entry is worth comparing at all


_EN_CONTRACTIONS = (
    (re.compile(r"\bcan't\b|\bcannot\b"), "can not"),
    (re.compile(r"\bwon't\b"), "will not"),
    (re.compile(r"\b(\w+)n't\b"), r"\1 not"),
    (re.compile(r"\bi'm\b"), "i am"),
    (re.compile(r"\b(\w+)'(?:ve|ll|d|re)\b"), r"\1"),
)
_ZH_NEG = re.compile(
    r"再也不|从来不|从不|不再|已经不|没(?!错)|不(?![错过同少久断仅但管如然止])|别(?![人的处])|未(?![来必])|"
    r"并非|戒了|戒掉了?"
)
_EN_NEG = re.compile(
    r"\b(?:no longer|not any ?more|never|not|no more|stopped|quit|gave up|give up|no)\b(?:\s+(?:doing|to))?"
)
_NEGATION_CUES = re.compile(r"[不没别未非戒]|\b(?:no|not|never|stopped|quit|gave|give)\b|n't")

_ZH_SPEAKER = re.compile(r"该用户|这位用户|用户|本人")
_EN_SPEAKER = ((re.compile(r"\b(?:the )?user's\b"), "my"), (re.compile(r"\b(?:the )?user\b"), "i"))
_ZH_FILLER = re.compile(
    r"(?:还|仍然?|依然|一直)在(?=[" + HAN + r"])|现在|目前|如今|最近|已经|一直|平时|通常|总是|经常|真的|其实|"
    r"特别|非常|比较|依然|仍然|还是|的话|一[个辆只位台家条件本套部]|[很挺都也还又就了啦呢吧啊哦嘛]"
)
_EN_FILLER = re.compile(
    r"\b(?:really|very|currently|now|still|also|just|actually|do|does|did|a|an|the|anymore|any more|"
    r"these days|nowadays|at the moment|right|so|quite|too|always|usually)\b"
)
_ZH_SYNONYM = (("喜爱", "喜欢"), ("热爱", "喜欢"), ("早晨", "早上"), ("天天", "每天"), ("晚上", "晚上"))
_EN_SYNONYM = {"love": "like", "enjoy": "like", "adore": "like", "am": "be", "is": "be", "are": "be"}
_WORD = re.compile(r"[a-z]+")

_SURNAMES = (
    "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈姚卢姜"
    "崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万钱严覃武戴莫孔向汤"
)
_ZH_ORGS = re.findall(
    r"\S+",
    "字节跳动 阿里巴巴 阿里云 阿里 腾讯 百度 美团 京东 华为 小米 网易 拼多多 滴滴 快手 蚂蚁集团 携程 微软 谷歌 亚马逊 "
    "飞书 抖音 微信 淘宝 支付宝 比亚迪 特斯拉 宁德时代 大疆 商汤 旷视 蔚来 理想 小红书 哔哩哔哩 知乎 联想 中兴 招商银行",
)
_PLACE_WORDS = sorted({*ZH_PLACES}, key=len, reverse=True)
_ZH_ENTITY = re.compile(
    "(?P<place>(?:"
    + "|".join(_PLACE_WORDS)
    + ")[区市省县]?|(?:(?<=[在住于到去来从自])|^)["
    + HAN
    + r"]{2,3}(?:区|市|省|县|镇))"
    + "|(?P<org>"
    + "|".join(sorted(_ZH_ORGS, key=len, reverse=True))
    + "|["
    + HAN
    + r"]{2,6}(?:集团|银行|大学|学院|研究院))"
    + "|(?P<person>[老小]["
    + _SURNAMES
    + "](?!["
    + HAN
    + "]{0,1}(?:时|天|朋友|孩子|狗|猫))|["
    + _SURNAMES
    + r"](?:总|经理|老师|先生|女士|医生|教授|博士|主任|工|姐|哥))"
)
_EN_PLACE_SET = frozenset(EN_PLACES)
# Characters without which a pattern cannot match (a cheap test before running it).
_NEG_CHARS = frozenset("再从不已没别未并戒")
_NUM_CHARS = frozenset("0123456789零〇一二两三四五六七八九十百千万亿")
_ENTITY_CHARS = frozenset(
    {w[0] for w in ZH_PLACES} | {w[0] for w in _ZH_ORGS} | set("老小总经师生士授任工姐哥区市省县镇团行学院")
)
_LATIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9+#&.'-]*(?: [A-Z][A-Za-z0-9+#&.'-]*)*")
_EN_NOT_NAME = frozenset(
    re.findall(
        r"\S+",
        "i i'm i've i'd my me the a an user users and but or so also then when if in on at to of for from with by "
        "as is are was were be been he she they we you it this that ok",
    )
)
_NUMBER = re.compile(rf"(?P<ord>第|#|no\.\s?)?(?P<n>{similarity.NUMBER})")
_ACCUMULATE = re.compile(
    r"去过|到过|喜欢|爱|讨厌|认识|见过|有|和|跟|与|及|养|想去|玩过|吃过|或|、|"
    r"\b(?:visit\w*|been|like\w*|love\w*|hate\w*|know\w*|met|meet\w*|ha(?:ve|s)|with|and|or)\b"
)

_ZH_SLOT = (
    re.compile(
        r"^我的(?P<s>[^是叫为换改变不没]{1,8}?)(?:现在|目前|已经|也|就|还|又)*"
        r"(?:是|叫|为|换成了?|改成了?|变成了?|改为|换为|换了?)(?P<v>.+)$"
    ),
    re.compile(
        r"^我(?:把|将)我?的?(?P<s>[^是叫为换改变不没]{1,8}?)(?:换成|改成|改为|换为|变成)了?(?P<v>.+)$"
    ),
    re.compile(r"^我(?P<s>最喜欢的[^是]{1,6}?)(?:现在|目前)?是(?P<v>.+)$"),
)
_EN_SLOT = (
    re.compile(
        r"^my (?:new |current |present )?(?P<s>[a-z][a-z' -]{0,30}?)(?:'s(?!.* (?:is|are|was) )| is| are| was changed to| changed to| has "
        r"become| became)(?: now| currently)? (?:now |currently )?(?P<v>.+)$"
    ),
    re.compile(r"^i (?:changed|switched|updated|moved) my (?P<s>[a-z][a-z -]{0,30}?) to (?P<v>.+)$"),
)
_SLOT_STOP = frozenset(
    {
        "一个",
        "一位",
        "个",
        "这个",
        "那个",
        "one",
        "only",
        "favourite",
        "favorite",
        "name",
        "名字",
        "姓名",
        "全名",
    }
)
_SLOT_LEAD = re.compile(r"^(?:新|现在的|目前的|现任|当前的?|new |current )+")


class Reading(NamedTuple):
    """What one text says, ready to compare (docs/MEMORY.md, "Same fact or a change"). A tuple: one is
    built per stored line when a process first indexes a namespace."""

    norm: str
    core: str
    loose: str
    negations: int
    frame: str
    numbers: tuple[str, ...]
    ordinals: tuple[str, ...]
    entities: tuple[tuple[str, str], ...]
    slot: tuple[str, str] | None
    accumulative: bool
    leading_entity: bool


_HAS_LATIN = re.compile("[A-Za-z]")
_END = re.compile(r"[。.!！~]+$")


def _english(text: str) -> str:
    if _HAS_LATIN.search(text) is None:
        return text
    for pattern, repl in _EN_CONTRACTIONS:
        text = pattern.sub(repl, text)
    for pattern, repl in _EN_SPEAKER:
        text = pattern.sub(repl, text)
    return text


def _stem(word: str) -> str:
    word = _EN_SYNONYM.get(word, word)
    for suffix, keep in (("ing", 5), ("ed", 4), ("es", 4), ("s", 3)):
        if word.endswith(suffix) and len(word) >= keep + len(suffix) - 1:
            word = word[: -len(suffix)]
            break
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def _strip(text: str) -> str:
    """Speaker, fillers and synonyms of a (lower-cased, NFKC) text, before negation is taken out."""
    text = _ZH_SPEAKER.sub("我", text)
    for a, b in _ZH_SYNONYM:
        text = text.replace(a, b)
    text = _ZH_FILLER.sub("", text)
    if _HAS_LATIN.search(text) is not None:
        text = _EN_FILLER.sub(" ", text)
        text = _WORD.sub(lambda m: _stem(m.group()), text)
    return text


def _positive(text: str) -> str:
    return _EN_NEG.sub(" ", _ZH_NEG.sub("", _ZH_SPEAKER.sub("我", text)))


def _entities(raw: str) -> tuple[str, list[tuple[str, str]]]:
    """(the text with entities masked as @, the entities as (kind, value)). Works on NFKC, original case."""
    found: list[tuple[str, str]] = []

    def zh(m: re.Match[str]) -> str:
        kind = m.lastgroup or "name"
        found.append(("place" if kind == "place" else "name", m.group()))
        return "@"

    text = _ZH_ENTITY.sub(zh, raw)
    has_cjk = re.search(f"[{HAN}]", raw) is not None

    def latin(m: re.Match[str]) -> str:
        word = m.group()
        low = word.lower()
        if low in _EN_PLACE_SET:
            found.append(("place", low))
            return "@"
        start = m.start()
        sentence_start = start == 0 or text[:start].rstrip()[-1:] in (".", "!", "?", ":", ";", "")
        proper = (has_cjk and len(word) >= 2) or (word[0].isupper() and not sentence_start)
        if proper and low not in _EN_NOT_NAME:
            found.append(("name", low))
            return "@"
        return word

    text = _LATIN_NAME.sub(latin, text)
    return text, found


def _slot(norm_text: str) -> tuple[str, str] | None:
    """(slot, value) of a possessive statement, or None. Works on the text with speaker unified."""
    zh = _ZH_SPEAKER.sub("我", norm_text)
    if zh.startswith("我"):  # every Chinese slot pattern starts so; every English one with Latin letters
        for pattern in _ZH_SLOT:
            m = pattern.match(zh)
            if m:
                return _slot_value(m["s"], m["v"])
    if _HAS_LATIN.search(norm_text) is None:
        return None
    en = _english(norm_text)
    for pattern in _EN_SLOT:
        m = pattern.match(en)
        if m:
            return _slot_value(m["s"], m["v"])
    return None


def _slot_value(slot: str, value: str) -> tuple[str, str] | None:
    slot = _SLOT_LEAD.sub("", slot.strip()).strip()
    if not slot or slot in _SLOT_STOP or _NEGATION_CUES.search(slot) or _NEGATION_CUES.search(value[:6]):
        return None
    value = similarity.normalise(_strip(value)) or similarity.normalise(value)
    return (slot, value) if value else None


@lru_cache(maxsize=100_000)
def read(text: str) -> Reading:
    nfkc = " ".join(unicodedata.normalize("NFKC", text).split())
    low = _english(nfkc.lower())
    chars = frozenset(low)
    latin = _HAS_LATIN.search(low) is not None
    slot = _slot(_END.sub("", low).strip())
    # Each pattern runs only when a character it needs is there: most stored lines carry no negation,
    # number or entity, and the whole namespace is read once per process to build the index.
    negatable = latin or not chars.isdisjoint(_NEG_CHARS)
    negations = len(_ZH_NEG.findall(low)) + len(_EN_NEG.findall(low)) if negatable else 0
    positive = _strip(_positive(low) if negatable else _ZH_SPEAKER.sub("我", low))
    core = similarity.normalise(positive)
    if latin or not chars.isdisjoint(_ENTITY_CHARS):
        masked, entities = _entities(_english(nfkc))
        masked_positive = _strip(_positive(_english(masked.lower()).replace("@", "\x00")))
    else:
        masked_positive, entities = positive, []
    numbers: list[str] = []
    ordinals: list[str] = []

    def num(m: re.Match[str]) -> str:
        (ordinals if m["ord"] else numbers).append(m["n"])
        return "#"

    counted = not chars.isdisjoint(_NUM_CHARS)
    frame = similarity.normalise(_NUMBER.sub(num, masked_positive) if counted else masked_positive)
    frame = frame.replace("\x00", "@")
    return Reading(
        norm=similarity.normalise(nfkc),
        core=core,
        loose=core.replace("在", ""),
        negations=negations,
        frame=frame,
        numbers=tuple(sorted(numbers)),
        ordinals=tuple(sorted(ordinals)),
        entities=tuple(sorted(set(entities))),
        slot=slot,
        accumulative=_ACCUMULATE.search(masked_positive) is not None,
        leading_entity=frame.startswith("@"),
    )


@lru_cache(maxsize=20_000)
def person_topic(text: str) -> str | None:
    """The named third party a statement is about (``person:张三``), from the subject recogniser."""
    found = recognise(text)
    return found.subject if found is not None and found.subject.startswith("person:") else None


def _alike(a: str, b: str, floor: float) -> bool:
    if a == b:
        return True
    if len(a) >= 3 and len(b) >= 3 and (a in b or b in a):
        return True
    return similarity.jaccard(a, b) >= floor


#: The verdicts that say the same fact (in other words, or more of it): the only ones done in place.
REWORDING = frozenset({"same", "contains", "contained", "similar"})


@dataclass(frozen=True)
class Verdict:
    """`kind`: same, contains (new says more), contained (new says less), similar, conflict or other."""

    kind: str
    why: str = ""
    score: float = 0.0


def compare(new: str, old: str) -> Verdict:
    """How the statement `new` relates to the stored `old`; docs/MEMORY.md ("Same fact or a change")."""
    a, b = read(new), read(old)
    if a.slot and b.slot and a.slot[0] == b.slot[0]:
        x, y = a.slot[1], b.slot[1]
        # one value inside the other is the same value said more fully (杭州 / 杭州西湖区), unless a number differs
        if x == y or ((x in y or y in x) and similarity.numbers_agree(x, y)):
            return Verdict("same", score=3.0)
        return Verdict("conflict", "slot:" + a.slot[0])
    if a.negations != b.negations:
        if _alike(a.loose, b.loose, SAME_FRAME):
            return Verdict("conflict", "negation")
        return Verdict("other")
    if a.ordinals != b.ordinals:
        return Verdict("other")  # 第3个愿望 and 第4个愿望 are two wishes
    if (p := person_topic(new)) != (q := person_topic(old)) and p and q:
        return Verdict("other")  # 张三是… and 李四是… are about two people
    same_frame = _alike(a.frame, b.frame, SAME_FRAME)
    if a.numbers != b.numbers and not similarity.numbers_agree(" ".join(a.numbers), " ".join(b.numbers)):
        return Verdict("conflict", "number") if same_frame else Verdict("other")
    mine, theirs = set(a.entities), set(b.entities)
    if mine != theirs and not (theirs <= mine):
        kinds = {k for k, _ in mine ^ theirs}
        shared_kind = {k for k, _ in mine} & {k for k, _ in theirs} & kinds
        if same_frame and shared_kind and not (a.accumulative or b.accumulative or a.leading_entity):
            return Verdict("conflict", "place" if "place" in shared_kind else "name")
        return Verdict("other")
    return _rewording(a, b, new, old)


# Words that carry no fact of their own: swapping one (on → every, 在 → 于) is still a rewording.
_EN_FUNCTION = frozenset(
    [
        "i",
        "me",
        "my",
        "mine",
        "we",
        "us",
        "our",
        "you",
        "your",
        "he",
        "him",
        "his",
        "she",
        "her",
        "it",
        "its",
        "they",
        "them",
        "their",
        "in",
        "on",
        "at",
        "to",
        "of",
        "for",
        "from",
        "by",
        "with",
        "and",
        "or",
        "but",
        "be",
        "been",
        "being",
        "have",
        "ha",
        "had",
        "every",
        "each",
        "some",
        "this",
        "that",
        "these",
        "those",
        "there",
        "here",
        "as",
        "about",
        "into",
        "over",
        "up",
        "out",
        "off",
        "than",
        "then",
    ]
)
_ZH_FUNCTION = frozenset("的地得之在于是我你他她它们和与及或把被给对从向每个着过")
_HAN_CHAR = re.compile(f"[{HAN}]")


@lru_cache(maxsize=20_000)
def _terms(text: str) -> frozenset[str]:
    """The content words of `text` (stemmed Latin words, Han characters), speaker, fillers and negation out."""
    low = _english(" ".join(unicodedata.normalize("NFKC", text).lower().split()))
    positive = _strip(_positive(low))
    words = {w for w in _WORD.findall(positive) if w not in _EN_FUNCTION}
    return frozenset(words | (set(_HAN_CHAR.findall(positive)) - _ZH_FUNCTION))


def _rewording(a: Reading, b: Reading, new: str, old: str) -> Verdict:
    if a.core == b.core and a.core:
        return Verdict("same", score=3.0)
    if len(a.core) >= 4 and len(b.core) >= 4 and (b.core in a.core or a.core in b.core):
        return Verdict("contains" if b.core in a.core else "contained", score=2.0)
    if a.norm and len(a.norm) >= 4 and b.norm in a.norm and len(b.norm) >= 4:
        return Verdict("contains", score=2.0)
    if len(a.core) >= 4 and sorted(a.core) == sorted(b.core) and not a.negations:
        return Verdict("same", score=2.5)  # the same words in another order
    score = similarity.jaccard(a.core, b.core)
    if score < similarity.DUPLICATE:
        return Verdict("other", score=score)
    x, y = _terms(new), _terms(old)
    if x - y and y - x:  # a content word swapped for another (Monday → Friday, 香蕉 → 梨): maybe both true
        return Verdict("other", score=score)
    return Verdict("similar", score=score)


_PERSON_ATTRS = (
    (
        "所在地",
        re.compile(
            r"^(?:现在|目前|也|一直|已经)*(?:住在|住|定居在?|搬到了?|搬去了?|搬回了?|常驻|生活在|在(?!.*(?:工作|上班)$))"
            r"|^(?:now |just |recently |also )*(?:lives? in|is based in|moved to|based in|lives)",
            re.I,
        ),
    ),
    ("雇主", re.compile(r"就职于|入职|跳槽|在.+(?:工作|上班)$|works? (?:at|for)|joined", re.I)),
    (
        "职位",
        re.compile(
            r"(?:联合创始人|创始人|合伙人|CEO|CTO|CFO|COO|经理|主管|总监|老板|上司|领导|负责人|总裁|主任|"
            r"co-?founder|founder|ceo|cto|manager|boss|director|lead|head)$",
            re.I,
        ),
    ),
)
_CALL_ME = re.compile(r"叫我|称呼我|喊我|\bcall me\b|\bi go by\b|\baddress me\b", re.I)


def person_attribute(value: str) -> str | None:
    """Which attribute of a named person a recognised value sets: 所在地, 雇主 or 职位; None for the rest
    (a relation like 我的同事 or a trait), which accumulates and never ends another fact about them."""
    for attr, pattern in _PERSON_ATTRS:
        if pattern.search(value.strip()):
            return attr
    return None


def calls_me(text: str) -> bool:
    """A form of address (以后叫我小明, call me Sam): it adds to a full name, it does not replace it."""
    return _CALL_ME.search(text) is not None


_CLAUSE = re.compile(r"[，,;；。!！]+")


def clauses(text: str) -> list[str]:
    return [c.strip() for c in _CLAUSE.split(text) if c.strip()]


def carried(part: str, whole: str) -> list[str]:
    """The clauses of `whole` that `part` repeats (as `with_speaker` made them stand alone): what a
    remainder cut out of `whole` (book `_keep_remainder`) took from it. [] unless `part` is such a cut."""
    own = set(clauses(part))
    cut = [c for c in clauses(whole) if c in own or with_speaker(c, whole) in own]
    return cut if 0 < len(cut) < len(clauses(whole)) else []


def with_speaker(clause: str, whole: str) -> str:
    """A clause cut out of `whole`, made to stand alone: 在字节跳动做后端开发 → 我在字节跳动做后端开发."""
    c = clause.strip()
    if re.match(r"^(?:我|用户|i\b|my\b|i'm\b)", c, re.I):
        return c
    if re.match(r"^(?:我|用户)", whole.strip()):
        return "我" + c
    if re.match(r"^(?:i|i'm|my)\b", whole.strip(), re.I) and c[:1].islower():
        return "I " + c
    return c
