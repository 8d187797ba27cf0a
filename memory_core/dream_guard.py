"""The text checks of the dream cage: what a model-written text must keep (`key_terms`), and what it may
never carry."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

from .injection import instructions
from .policy import HAN
from .recall import HINTS
from .similarity import bigrams, normalise

MIN_TEXT_CHARS = 4  # shorter than this is not a memory (spec §8.7)
MIN_COVERAGE = 0.5  # share of a source's bigrams that must survive in the rewrite

_HAS_CJK = re.compile(f"[{HAN}]")
_DIGITS = re.compile(r"\d+")
_CN_NUMERAL = re.compile(r"[零〇一二两三四五六七八九十百千万]+[年月日号点岁周天次楼层]")
_LATIN = re.compile(r"[A-Za-z][A-Za-z0-9+#]*(?:['.-][A-Za-z0-9+#]+)*")
_SENTENCE_END = re.compile(r"[.!?;:。！？；：\n]")
_EN_STOP = frozenset(
    re.findall(
        r"\S+",
        "i i'm i've i'd me my mine the a an this that these those it its he she they we you your user users "
        "and but or so also then when if in on at to of for from with by as is are was were be been",
    )
)
_CUE = re.compile(
    r"(?:叫做|名叫|叫|姓|(?<![这就但还可于总只像要若真老凡也都倒正即便])是|住在|(?<![现正存实所好])在(?!于)|来自|养了|养|"
    rf"使用|(?<![费作有常信应使采])用(?!户)|对|喜欢|爱|讨厌|不吃|不喝)"
    rf"(?:[了的很也还都又最]|[一两几][个只名位条家所种件]|[个只名位条家所种件])*"
    rf"(?:[喝吃玩看听去做打穿养用](?=[{HAN}]{{2}}))?([{HAN}]{{2}})"
)
_NEGATION = re.compile(r"[不没别未勿]|\b(?:never|not|no|none|nobody|nothing)\b|n't", re.I)
_COVERAGE_SKIP = frozenset("我的了")

_REFUSAL = re.compile(
    r"抱歉[，,]|对不起[，,]|很抱歉|无法根据|无法生成|无法完成|信息不足|没有足够|不便提供|"
    r"作为(?:一个)?(?:ai|人工智能|语言模型)|"
    r"\bi'?m sorry\b|\bi am sorry\b|\bi cannot\b|\bi can'?t\b|\bi'?m unable\b|"
    r"\bunable to (?:generate|provide|create|complete)\b|\bas an ai(?: language)? model\b",
    re.I,
)


_PLACE_SUFFIX = (
    "特别行政区|自治区|新区|区域|地区|区|市|省|州府|县|镇|乡|村|路|街|巷|弄|胡同|小区|大厦|广场|公园|"
    "机场|车站|火车站|地铁站|港|湾|岛|大学|学院|中学|小学|医院|公司|集团|银行|酒店|总部|分部|办公室|"
    "机房|数据中心|国"
)
_PLACE_TERM = re.compile(rf"([{HAN}]{{2}})({_PLACE_SUFFIX})")
_PLACE_LEAD = frozenset("在住到去从于来往是的了过和与及跟")
_EN_PLACE = re.compile(
    r"\b(?:north|south|east|west|northern|southern|eastern|western|central|downtown|uptown|suburbs?|"
    r"district|region|province|county|state|city|town|village|campus|office|headquarters|branch|"
    r"airport|station|street|avenue|road|floor)\b",
    re.I,
)
_ZH_QUALIFIER = re.compile(
    r"每(?:天|日|晚|早|周[一二三四五六日天]?|星期[一二三四五六日天]?|月|年|次|隔)|工作日|周末|节假日|"
    r"早上|早晨|上午|中午|下午|傍晚|晚上|夜里|凌晨|半夜|偶尔|经常|总是|通常|一般|很少|从不|从来|"
    rf"只(?=[{HAN}])|仅|唯一|不太|非常|特别|有点|稍微|大约|左右|以上|以下|至少|最多|之前|以后|"
    r"以前|曾经|暂时|长期|短期|永久|远程|兼职|全职|东部|西部|南部|北部|中部|东边|西边|南边|北边|"
    r"[东西南北]区|市中心|郊区|老家|本地"
)
_EN_QUALIFIER = re.compile(
    r"\b(?:always|never|usually|often|sometimes|rarely|seldom|occasionally|only|every|each|daily|weekly|"
    r"monthly|yearly|weekdays?|weekends?|mornings?|evenings?|nights?|afternoons?|mostly|mainly|"
    r"except|remote(?:ly)?|part-time|full-time|temporarily|permanently|formerly|previously|"
    r"about|around|approximately|least|most)\b",
    re.I,
)
_ZH_QUANTITY = re.compile(
    r"[零〇一二两三四五六七八九十百千万半几]+(?:个|只|位|条|家|所|种|件|台|辆|套|本|次|间|张|双|口|头|匹|"
    r"棵|瓶|杯|碗|份|节|门|层|楼|年|月|日|号|点|岁|周|天|小时|分钟|公里|米|斤|公斤|元|块)"
)
_EN_QUANTITY = re.compile(
    r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|hundred|thousand|million|"
    r"dozen|half|twice|thrice|once|single|double|both|several|few|many)\b",
    re.I,
)


def _nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def numbers(text: str) -> frozenset[str]:
    """Every digit run of `text` as a canonical integer string (06 → 6)."""
    return frozenset(d.lstrip("0") or "0" for d in _DIGITS.findall(_nfkc(text)))


def _latin_terms(text: str) -> set[str]:
    if _HAS_CJK.search(text):
        return {w.lower() for w in _LATIN.findall(text) if len(w) >= 2}
    terms: set[str] = set()
    for sentence in _SENTENCE_END.split(text):
        for i, m in enumerate(_LATIN.finditer(sentence)):
            word = m.group(0)
            if word.lower() in _EN_STOP:
                continue
            capitalised = word[0].isupper() and (i > 0 or word.isupper())
            if capitalised or any(ch.isdigit() for ch in word):
                terms.add(word.lower())
    return terms


def _cjk_terms(text: str) -> set[str]:
    found = {m.group(1) for m in _CUE.finditer(text)}
    found.update(m.group(0) for m in _CN_NUMERAL.finditer(text))
    low = text.lower()
    found.update(h for h in HINTS if h in low)
    return found


def _places(text: str) -> set[str]:
    """西湖区, 东京区域, 浦东机场: the suffix and the two CJK characters before it, minus a leading
    function character (在/住/到… — 住在杭州西湖区 gives 西湖区, 去过美国 gives 美国)."""
    found: set[str] = set()
    for m in _PLACE_TERM.finditer(text):
        head = m.group(1)
        while head and head[0] in _PLACE_LEAD:
            head = head[1:]
        found.add(head + m.group(2))
    return found


def content_terms(text: str) -> dict[str, str]:
    """The places, qualifiers and quantities of `text` (normalised term → kind: place, qualifier,
    quantity). A rewrite that drops one says less than its sources; one that adds one invents."""
    nf = _nfkc(text)
    terms: dict[str, str] = {}
    for kind, found in (
        ("place", _places(nf) | {m.group(0).lower() for m in _EN_PLACE.finditer(nf)}),
        ("qualifier", {m.group(0).lower() for r in (_ZH_QUALIFIER, _EN_QUALIFIER) for m in r.finditer(nf)}),
        ("quantity", {m.group(0).lower() for r in (_ZH_QUANTITY, _EN_QUANTITY) for m in r.finditer(nf)}),
    ):
        for term in found:
            norm = normalise(term)
            if norm:
                terms.setdefault(norm, kind)
    return terms


def key_terms(text: str) -> frozenset[str]:
    """The terms of `text` a rewrite must keep, numbers excluded (docs/MEMORY.md, "The dream cage's text
    checks"). The checks err towards rejecting: a rejected merge costs a tidy-up, an accepted bad one a fact."""
    nf = _nfkc(text)
    found = {normalise(t) for t in _latin_terms(nf) | _cjk_terms(nf)}
    return frozenset(t for t in found | set(content_terms(nf)) if t)


def _term_label(term: str, source: str) -> str:
    kind = content_terms(source).get(term)
    return f"{kind} {term}" if kind else term


def _contains(hay: tuple[str, str], term: str) -> bool:
    """`term` in `hay` (normalised, and normalised word by word); a Latin term must be a whole word
    there (only ≠ lonely), a CJK term a substring."""
    joined, spaced = hay
    if not term.isascii():
        return term in joined
    return re.search(rf"(?<![a-z0-9]){re.escape(term)}(?![a-z0-9])", spaced) is not None


def _hay(*texts: str) -> tuple[str, str]:
    """The texts normalised, and normalised with their words kept apart (for whole-word tests)."""
    joined = " ".join(normalise(t) for t in texts)
    spaced = " ".join(normalise(w) for t in texts for w in re.split(r"[\s,;:!?。，；：！？、]+", _nfkc(t)))
    return joined, spaced


def has_negation(text: str) -> bool:
    return _NEGATION.search(_nfkc(text)) is not None


def coverage(source: str, rewrite: str) -> float:
    """Share of the source's character bigrams (without 我/的/了) found in the rewrite."""
    grams = {g for g in bigrams(source) if len(g) == 2 and not (set(g) & _COVERAGE_SKIP)}
    if not grams:
        return 1.0
    return len(grams & bigrams(rewrite)) / len(grams)


def missing_terms(sources: Sequence[str], rewrite: str) -> list[str]:
    """What of the sources the rewrite lost: terms, numbers, negation, or a whole source (coverage)."""
    hay = _hay(rewrite)
    kept_numbers = numbers(rewrite)
    missing: list[str] = []
    for src in sources:
        missing.extend(sorted(_term_label(t, src) for t in key_terms(src) if not _contains(hay, t)))
        missing.extend(sorted(n for n in numbers(src) if n not in kept_numbers))
        if coverage(src, rewrite) < MIN_COVERAGE:
            missing.append(f"coverage<{MIN_COVERAGE:.0%}: {src[:24]}")
    if any(has_negation(s) for s in sources) and not has_negation(rewrite):
        missing.append("negation")
    return list(dict.fromkeys(missing))


# Where one statement of a rewrite ends and the next begins: punctuation, and the conjunctions that join
# two statements (但, 而, but, while) — each source is checked against the one it reads as.
_CLAUSE = re.compile(
    r"[,;.!?，；。！？、]+|(?:但是|但|不过|而且|而|却|并且|同时)|\s+(?:but|and|while|whereas|though)\s+", re.I
)


def moved_terms(sources: Sequence[str], rewrite: str) -> list[str]:
    """What a rewrite of several sources says of the wrong one: each source must read, in the clause of the
    rewrite closest to it (most of its bigrams), with its own negation and its own numbers. Checked over
    the whole rewrite, 喜欢咖啡 + 不喜欢绿茶 → 不喜欢咖啡，喜欢绿茶 kept every term and a negation, and
    会议室在3楼 + 食堂在15楼 → 会议室在15楼，食堂在3楼 every number."""
    if len(sources) < 2:
        return []
    parts = _clauses(rewrite)
    moved: list[str] = []
    for src in sources:
        for said in _clauses(src):  # a source of several clauses (3岁，不吃鱼): each finds its own
            best = max(parts, key=lambda p: coverage(said, p))
            if has_negation(said) != has_negation(best):
                moved.append(f"negation: {said[:24]}")
            if lost := sorted(numbers(said) - numbers(best)):
                moved.append(f"number {', '.join(lost)}: {said[:24]}")
    return list(dict.fromkeys(moved))


def _clauses(text: str) -> list[str]:
    return [p for p in _CLAUSE.split(_nfkc(text)) if p and p.strip()] or [text]


def invented_terms(sources: Iterable[str], rewrite: str) -> list[str]:
    """Numbers and key terms of the rewrite that no source contains: the model made them up."""
    texts = list(sources)
    hay = _hay(*texts)
    have_numbers = frozenset().union(*(numbers(s) for s in texts)) if texts else frozenset()
    invented = sorted(_term_label(t, rewrite) for t in key_terms(rewrite) if not _contains(hay, t))
    invented += sorted(n for n in numbers(rewrite) if n not in have_numbers)
    return invented


def is_refusal(text: str) -> bool:
    return _REFUSAL.search(_nfkc(text)) is not None


def new_instructions(sources: Iterable[str], rewrite: str) -> list[str]:
    """Instruction-like phrases of the rewrite that none of the sources contains."""
    seen = frozenset().union(*(instructions(s) for s in sources))
    return sorted(p for p in instructions(rewrite) if p not in seen)


def one_line(text: str) -> str:
    """Collapse all white space (newlines included) to single spaces: a memory is one line."""
    return " ".join(text.split()) if text else ""
