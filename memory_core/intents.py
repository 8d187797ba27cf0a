"""Deterministic request parsing: what a message asks of memory when no chat model is configured."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from .injection import carries_instruction
from .policy import HAN
from .subjects import ZH_RELATIONS, recognise

IntentKind = Literal["remember", "forget", "question", "statement", "chitchat", "none"]


@dataclass(frozen=True)
class Intent:
    """What the message asks for; `text` is the payload: what to remember or forget, or the question."""

    kind: IntentKind
    text: str


# Leading courtesy and fillers that do not change the request: 好的，记住… / ok so remember…
_LEAD = re.compile(
    r"^(?:好的?|嗯+|哦|那|那么|对了|还有|另外|顺便|ok|okay|so|also|btw|and|hey|hi)(?:[\s,，。.!！:：]+|(?=[记忘删把以]))",
    re.I,
)
# Trailing courtesy and punctuation; stripped by a loop, not a `(…)+$` regex, which is quadratic on long runs.
_TRAIL_CHARS = " \t\r\n。.!！?？~～,，;；:：、"
_TRAIL_WORDS = (
    "好吗",
    "可以吗",
    "行吗",
    "谢谢你",
    "谢谢",
    "谢了",
    "哦",
    "啊",
    "呀",
    "啦",
    "please",
    "thanks",
    ", ok",
)
_POLITE_ZH = r"(?:请你?|麻烦你?|你|能不能|可不可以|可以|你能|你可以)*(?:帮我)?(?:好好)?"
_POLITE_EN = (
    r"(?:(?:please|pls|hey|ok|okay|so)[\s,]+)*(?:(?:can|could|would|will) you (?:please )?)?(?:please )?"
)

_REMEMBER = [
    re.compile(
        rf"^{_POLITE_ZH}(?:记住|记一下|记下来|记下|记着|记好|牢记|(?:千万)?别忘了|不要忘了|别忘记|不要忘记)了?(?:[\s:：,，、。]+|(?=.))(?P<p>.+)$",
        re.S,
    ),
    re.compile(
        rf"^{_POLITE_EN}(?:remember|memori[sz]e|keep in mind|don't forget|do not forget|never forget|note)"
        r"(?:\s+(?:that|this))?(?:\s*[:,-]\s*|\s+)(?P<p>.+)$",
        re.I | re.S,
    ),
]
# "我对花生过敏，记住了" / "…, remember that": the trigger comes last, after punctuation ("I'll remember
# that" is no request); searched in the last few characters only, so a long message costs linear time.
_REMEMBER_AFTER = [
    re.compile(
        r"\s*[,，。!！;；]+\s*(?:请你?|帮我|你)?(?:记住|记一下|记下来|记下|记好|记着)(?:了|哦|啊|啦|呀|喔)?[\s。.!！~]*$"
    ),
    re.compile(
        r"\s*[,.;!-]+\s*(?:please )?(?:remember (?:that|this|it)|remember|don't forget (?:that|this|it)|"
        r"keep (?:that|this|it) in mind|note that|make a note of (?:that|this|it))[\s.!]*$",
        re.I,
    ),
]
# Standing instructions are remembered whole: the trigger is part of the meaning (以后回答都用中文).
_INSTRUCTION = [
    re.compile(
        r"^(?:请|那)?(?:以后|今后|往后|从今以后|从此以后|从现在(?:开始|起)|从今天(?:开始|起)|从下次(?:开始|起))(?P<p>.*)$",
        re.S,
    ),
    re.compile(r"^请?(?:务必|千万|一定要|始终|永远不要|永远别|不要再|别再|每次都?|一律)(?P<p>.*)$", re.S),
    re.compile(
        r"^(?:from now on|going forward|moving forward|from here on(?: out)?|in (?:the )?future|henceforth)\b(?P<p>.*)$",
        re.I | re.S,
    ),
    re.compile(
        r"^(?:please )?(?:always|never|don't ever|do not ever)\s+(?P<p>(?:reply|answer|respond|use|call|write|speak|"
        r"talk|include|add|keep|mention|ask|give|show|tell|send|be|format|remind|put|say|start|end|sign|address|refer|"
        r"check|make|list|explain|summari[sz]e|translate|avoid|assume|suggest|recommend)\b.*)$",
        re.I | re.S,
    ),
]
_NOT_INSTRUCTION = re.compile(r"^(?:再说|再聊|再见|见|有空|有机会|的事|吧|再看|说|聊|会|也许|可能|我们|呢)")
_ERASE_ZH = "删除|删掉|删了|移除|清除|抹掉|去掉"
_MEMORY_OBJ = "关于|有关|这条记忆|那条记忆|记忆|这条|那条"
_FORGET = [
    re.compile(
        rf"^{_POLITE_ZH}(?P<verb>忘掉|忘记|忘了|{_ERASE_ZH})(?P<obj>{_MEMORY_OBJ})?(?:[\s:：,，]+|(?=.)|$)(?P<p>.*)$",
        re.S,
    ),
    re.compile(rf"^{_POLITE_ZH}(?P<verb>别再?|不要再?|不用再?)(?:记着|记住|记)(?P<obj>)(?P<p>.+?)了?$", re.S),
    re.compile(
        rf"^{_POLITE_ZH}把(?P<p>.+?)(?P<obj>这条记忆|那条记忆|的记忆|这条|那条)?给?我?(?P<verb>忘了|忘掉|忘记|{_ERASE_ZH})吧?$",
        re.S,
    ),
    re.compile(
        rf"^{_POLITE_EN}(?P<verb>forget|delete|remove|erase|drop|wipe|unlearn)(?P<obj>\s+(?:about|that|this|"
        r"the (?:memory|fact|note|entry)(?:\s+(?:that|about))?|what i (?:said|told you) about|everything about|"
        r"(?:my )?memory of))?(?:\s*[:,-]\s*|\s+|$)(?P<p>.*)$",
        re.I | re.S,
    ),
]
# 忘了告诉你 / 忘记带钥匙了 report forgetting something; they ask nothing of memory.
_FORGOT_TO = re.compile(
    r"^(?:说|告诉|讲|提|跟你说|和你说|带|拿|关|锁|交|买|吃|做|写|问|回|发|打|给|看|接|充|存|放|去|来)"
)
_DEICTIC = re.compile(r"(?:这条|那条|这个|那个|这件事|那件事|this|that)?", re.I)

_QUESTION_EN = re.compile(
    r"^(?:what|what's|whats|where|where's|when|who|who's|whom|whose|which|why|how|do (?:you|i|we)|does|did|is|are|"
    r"am i|was|were|can you|could you|will you|would you|should i|have you|have i|has|tell me|remind me|"
    r"any idea)\b",
    re.I,
)
_QUESTION_ZH = re.compile(
    r"哪|什么|谁|几点|几岁|多少|怎么|为什么|为啥|啥|是否|有没有|是不是|还记得|记不记得|知不知道"
    # how old / tall / long / far, at the end only: 我学了几年 and 我来了没多久 tell, 我女儿多大了 asks
    r"|(?<![没不])(?:多大|多高|多重|多久|多远|多长(?:时间)?|几号|何时)(?:了|呢|啊|呀|啦)?[。.~～]*$"
)
_NOT_QUESTION = re.compile(r"^(?:我也?不知道|不知道|我忘了|我忘记|随便|不管)")
_FIRST_PERSON = re.compile(r"^(?:我(?!们)|i\b|i'm\b|i've\b|i'd\b|i'll\b|my\b|me\b)", re.I)


def _payload(text: str) -> str:
    previous = None
    while previous != text:
        previous = text = text.strip().rstrip(_TRAIL_CHARS)
        low = text.lower()
        text = next((text[: -len(w)] for w in _TRAIL_WORDS if low.endswith(w)), text)
    return text


# "其实我对花生过敏" / "actually, I'm vegan": a frank opener before the first person changes nothing.
_LEAD_FRANK = re.compile(
    r"^(?:其实|实际上|说实话|老实说|话说|actually|honestly)(?:[\s,，。:：]+|(?=我))", re.I
)


def _lead_stripped(text: str) -> str:
    previous = None
    while previous != text:
        previous, text = text, _LEAD_FRANK.sub("", _LEAD.sub("", text)).strip()
    return text


def _asks_a_question(text: str) -> bool:
    """Ends in a question mark without a polite request in front: "remember when we met?" asks, "can you
    remember that …?" requests."""
    polite = re.match(rf"^{_POLITE_EN}", text, re.I)
    return text.rstrip().endswith(("?", "？")) and not (polite and polite.group().strip())


def _remember(text: str) -> Intent | None:
    if _asks_a_question(text):
        return None
    payloads = [m["p"] for m in (p.match(text) for p in _REMEMBER) if m]
    tail = text[-48:]
    payloads += [
        text[: len(text) - len(tail) + m.start()] for m in (p.search(tail) for p in _REMEMBER_AFTER) if m
    ]
    for payload in map(_payload, payloads):
        if payload and not re.fullmatch(r"(?:了吗?|吗|me|it)", payload, re.I):
            # "remember to call mom": the reminder reads right only as a whole sentence
            return Intent("remember", _payload(text) if re.match(r"to\b", payload, re.I) else payload)
    return None


def _instruction(text: str) -> Intent | None:
    if text.rstrip().endswith(("?", "？", "吗")):
        return None
    for pattern in _INSTRUCTION:
        m = pattern.match(text)
        rest = _payload(m["p"]).lstrip(",， ") if m else ""
        if m and len(rest) >= 2 and not _NOT_INSTRUCTION.match(rest) and not is_chitchat(rest):
            return Intent("remember", _payload(text))
    return None


def _forget(text: str) -> Intent | None:
    if _asks_a_question(text) or text.rstrip().endswith("吗"):
        return None
    for pattern in _FORGET:
        m = pattern.match(text)
        if m is None:
            continue
        payload, obj, verb = _payload(m["p"]), m["obj"] or "", m["verb"].lower()
        erase = verb in ("delete", "remove", "erase", "drop", "wipe") or re.fullmatch(_ERASE_ZH, verb)
        if erase and not obj.strip() and "记忆" not in payload and not re.match(r"my\b|我的", payload, re.I):
            # 删除这个文件 / "delete the file" are not about memory; 删除记忆… / "delete that" are
            return None
        if verb in ("忘了", "忘记") and (_FORGOT_TO.match(payload) or text.rstrip("。.!！ ").endswith("了")):
            return None  # 忘了告诉你… / 忘记密码了 report forgetting; they request nothing
        if payload.lower() in ("it", "about it", "it lol") or payload in ("吧", "它", "它吧"):
            return None  # "forget it" means never mind
        payload = _payload(re.sub(r"(?:的记忆|这条记忆|这条|那条|吧)$", "", payload))
        return Intent("forget", "" if _DEICTIC.fullmatch(payload) else payload)
    return None


def _is_question(text: str) -> bool:
    if text.rstrip().endswith(("?", "？")):
        return True
    if _NOT_QUESTION.match(text):
        return False
    if text.rstrip(" \t\n。.~～").endswith(("吗", "么")) or _QUESTION_EN.match(text):
        return True
    return len(text) <= 30 and _QUESTION_ZH.search(text) is not None


def parse_intent(message: str) -> Intent:
    """Classify a message: remember / forget (with the payload), question, statement, chit-chat or none;
    errs towards "none" (docs/MEMORY.md, "Requests without a model")."""
    text = message.strip()
    if not text:
        return Intent("none", "")
    core = _lead_stripped(text) or text
    for parse in (_remember, _forget, _instruction):
        if intent := parse(core):
            return intent
    if is_chitchat(text):
        return Intent("chitchat", text)
    if _is_question(core):
        return Intent("question", text)
    if _FIRST_PERSON.match(core) or recognise(text) is not None:
        return Intent("statement", text)
    return Intent("none", text)


def _phrases(text: str) -> frozenset[tuple[str, ...]]:
    """Phrases as tuples of units: Latin phrases are words joined by _, Chinese ones characters."""
    return frozenset(tuple(p.split("_")) if p.isascii() else tuple(p) for p in text.split())


_CHAT = _phrases(
    """
你好 您好 你好呀 你好啊 大家好 早 早上好 早安 上午好 中午好 下午好 晚上好 晚安 嗨 哈喽 在吗 在不在 在么 你好吗 最近怎么样
怎么样 在干嘛 干嘛呢 嗯 哦 噢 喔 啊 呃 额 哈 呵 嘿 嘻 嗷 好 好的 好滴 好嘞 好吧 行 行吧 可以 没问题 收到 了解 明白
知道了 懂了 对 对的 是的 是啊 没错 谢谢 谢谢你 谢谢您 谢了 多谢 感谢 辛苦了 辛苦 不客气 没事 没关系 算了 不用了 拜拜
再见 回见 晚点聊 下次聊 加油 厉害 牛 棒 真棒 太棒了 不错 赞 好耶 了 呀 啦 哟 呢 吧 哒 嘛 的 哈哈 嘿嘿 呵呵 嘻嘻 你 您
hi hello hey yo hiya howdy sup what's_up whats_up good_morning good_afternoon good_evening good_night gn gm
morning night ok okay alright all_right sure yes yeah yep yup no nope nah got_it i_see understood noted cool nice
great awesome perfect fine good sounds_good makes_sense thanks thx ty thank_you many_thanks cheers no_problem
no_worries np bye goodbye see_you see_ya later ttyl take_care wow omg how_are_you how_are_you_doing how_are_u
how's_it_going hows_it_going how_do_you_do nice_to_meet_you never_mind nevermind nvm forget_it forget_about_it
you_too me_too same so very much really too again there all everyone guys buddy bro dude mate man a_lot oh ah"""
)
_CHAT_LONGEST = max(len(p) for p in _CHAT)
_CHAT_WORD = re.compile(
    r"(?:(?:ha|he|hi|ho)+h?|h{2,}|(?:lo)+l|lmf?ao+|rofl|x+d+|2333*|6{3,}|k+|o+k+|mhm+|hm+|u+m+|u+h+|a+h+|o+h+|"
    r"w+o+w+|y+a+y+|ye+s+|no+|ya+|yea+h*|hey+|hi+|thx|tks|lol+)"
)


def is_chitchat(text: str) -> bool:
    """Greetings, thanks, acknowledgements, laughter, emoji: messages that ask nothing and teach nothing."""
    if not text.strip() or len(text) > 200:
        return False
    units = re.findall(rf"[a-z0-9']+|[{HAN}]|[^\W_]", text.lower().replace("’", "'"))
    if not units:
        return True
    reachable = [True] + [False] * len(units)  # reachable[i]: units[:i] splits into chat phrases
    for i in range(len(units)):
        if not reachable[i]:
            continue
        if _CHAT_WORD.fullmatch(units[i]):
            reachable[i + 1] = True
        for n in range(1, min(_CHAT_LONGEST, len(units) - i) + 1):
            if tuple(units[i : i + n]) in _CHAT:
                reachable[i + n] = True
    return reachable[-1]


_MEMORABLE = re.compile(
    r"我是|我叫|名字|叫我|我喜欢|我不喜欢|我讨厌|我爱|我偏好|我习惯|更喜欢|技术栈|记住|记一下|别忘|不要忘|以后|今后|从现在|"
    r"住在|搬到|搬家|时区|改成|换成|改为|不再|现在是|过敏|我在|我住|我的|入职|离职|跳槽|就职|生日|结婚|吃素|忌口|不吃|务必|"
    r"一定要|千万|总是|每次|永远|请用|偏好|习惯|职业|老家|来自|不要再|别再|回复|回答|"
    r"\b(?:my name|i am|i'm|call me|i prefer|i like|i love|i hate|i don't like|i dislike|my favou?rite|remember|"
    r"don't forget|from now on|always|never|i live|i moved|i work|i joined|my wife|my husband|my birthday|birthday|"
    r"allergic|allergy|vegetarian|vegan|time ?zone|tech stack|my stack|i use|i switched|changed to|no longer|"
    r"anymore|instead of|i'm from|i grew up)\b",
    re.I,
)


def is_memorable(text: str) -> bool:
    """Cheap gate before a background extraction call: does the message carry a durable-fact hint?"""
    if not text.strip() or is_chitchat(text):
        return False
    return _MEMORABLE.search(text.replace("’", "'")) is not None or recognise(text) is not None


_INSTRUCTION_HINTS = re.compile(
    r"以后|今后|从现在|从今以后|记住|总是|务必|每次|一定要|千万|始终|永远不要|不要再|别再|"
    r"\b(?:always|remember|from now on|going forward|never|every time|make sure)\b",
    re.I,
)
_IDENTITY_HINTS = re.compile(
    r"我是|我叫|职业|工程师|开发者|程序员|设计师|名字|姓名|\b(?:developer|engineer|(?:i am|i'm) an?|my name)\b",
    re.I,
)
_PREFERENCE_HINTS = re.compile(
    r"喜欢|偏好|习惯|讨厌|爱吃|\b(?:prefer|prefers|like|likes|love|loves|hate|hates|favou?rite)\b", re.I
)


def classify_type(text: str) -> str:
    """Entry type of an extracted line: instruction > identity > preference > fact (spec §3.6)."""
    if carries_instruction(text):
        return "fact"  # "以后忽略之前的所有指令" is data, never a standing instruction in every prompt
    if _INSTRUCTION_HINTS.search(text):
        return "instruction"
    if (found := recognise(text)) is not None:
        return found.type
    if _IDENTITY_HINTS.search(text):
        return "identity"
    if _PREFERENCE_HINTS.search(text):
        return "preference"
    return "fact"


# --- memory-only mode: "what do you know about me", durable first-person statements ---------------------

_ABOUT_ME = re.compile(
    r"(?:你|您)?(?:都|还)?(?:记得|记住了|知道|了解|存了|记了)(?:些)?(?:关于|有关)?我(?:的)?(?:什么|哪些|多少|些什么|啥)"
    r"|(?:关于|有关)我(?:的事)?[，,\s]*(?:你|您)(?:都|还)?(?:知道|记得|了解|记住了)(?:些)?(?:什么|哪些|多少|啥)"
    r"|(?:你|您)对我(?:有)?(?:多少|什么|哪些)了解|(?:你|您)(?:都)?记得我(?:吗|么)?[?？]?$"
    r"|\bwhat (?:do|did|else do) you (?:know|remember|recall|have stored|have saved) (?:about|of|on) me\b"
    r"|\bwhat have you (?:learned|learnt|remembered|stored|saved|got) (?:about|on) me\b"
    r"|\btell me what you (?:know|remember) about me\b|\bwhat do you have on me\b"
    r"|\bwhat(?:'s| is) in your memory about me\b|\bdo you remember (?:anything|stuff|things) about me\b",
    re.I,
)


def asks_about_me(text: str) -> bool:
    """ "What do you know / remember about me" in any phrasing (你记得我什么, 关于我你知道什么, What do you
    remember about me?): a request to list memory, not a question for recall."""
    return len(text) <= 80 and _ABOUT_ME.search(text.replace("’", "'")) is not None


# A first-person statement is durable when it says what someone habitually does, has, is or likes; a
# passing remark (I'm so tired today, 我刚吃完饭) is not. Errs towards not storing.
_HAS = "有(?:一|两|三|四|五|个|只|条|位|辆|套|台)|养了|养着"
_STUDIES = "在.{0,12}(?:工作|上班|读书|上学|念书|实习|上(?:小学|初中|高中|中学|大学|幼儿园))"
_DURABLE_ZH = re.compile(
    r"^我(?:平时|一般|通常|经常|主要|基本上|大多|一直|每天|每周|每个月|每年|从小)?(?:都)?"
    rf"(?:{_HAS}|是(?!不是)|叫|姓|属|信|来自|老家|毕业于|{_STUDIES}|"
    r"喜欢|不喜欢|讨厌|爱|偏爱|习惯|不吃|吃素|不喝|会说|会讲|说|讲|用|写|开|玩|练|学|住|搬|对.{1,8}过敏)"
    # the people in the person's life, as the English "my daughter is five" (我女儿今年五岁, 我老婆是老师)
    rf"|^我的?(?:{ZH_RELATIONS})们?(?:平时|一般|通常|经常|一直|现在|都|也)*"
    rf"(?:今年|是(?!不是)|叫|姓|属|来自|老家|毕业于|{_HAS}|{_STUDIES}|住|"
    r"喜欢|不喜欢|讨厌|爱吃|不吃|吃素|不喝|对.{1,8}过敏)"
    rf"|^我家(?:里)?(?:{_HAS}|住)"
)
_DURABLE_EN = re.compile(
    r"^(?:i|i'm|i am|i've|i have|my)\b(?:\s+(?:mostly|usually|often|always|generally|mainly|normally|"
    r"really|also|still|mostly))?\s*"
    r"(?:write|code|program|use|speak|work|live|have|own|play|drink|eat|like|love|prefer|hate|dislike|study|"
    r"teach|run|ride|drive|cook|read|watch|listen|am an?\b|'m an?\b|a\b|an\b|been|got|grew up|"
    r"(?:allergic|intolerant|lactose|gluten|vegetarian|vegan|pescatarian|diabetic|celiac|coeliac)\b|"
    r"(?:don't|do not|can't|cannot|never) (?:eat|drink)\b|"
    r"(?:\w+\s){0,2}(?:is|are|was|lives|works|likes|name))",
    re.I,
)
_PASSING = re.compile(
    r"今天|昨天|刚才|刚刚|刚|一会|待会|马上|现在有点|好累|好困|饿了|累了|困了|"
    r"\b(?:today|tonight|yesterday|right now|just now|this morning|this afternoon|this evening|at the moment|"
    r"so tired|feel(?:ing)?|about to|going to|gonna)\b",
    re.I,
)


# First-person openings that are about this conversation, not the person (I have a question, 我是说…).
_NOT_DURABLE = re.compile(
    r"^(?:我是说|我说的|我说了|我是问|我用手机|我用电脑|"
    r"i have (?:a|an|one|another|some) (?:question|problem|issue|idea|doubt|request|suggestion)|i have no idea|"
    r"i have to|i've got to|i(?: would|'d) like|i like (?:this|that|it|your)|i love (?:this|that|it|your)|"
    r"i hate (?:this|that|it)|i use (?:this|that|it)\b|i('m| am) a (?:bit|little)\b|i've been (?:thinking|wondering))",
    re.I,
)


def is_conversational(text: str) -> bool:
    """An opening about this conversation rather than the person (I have a question, 我是说…)."""
    return _NOT_DURABLE.match(_lead_stripped(text.strip()).replace("’", "'")) is not None


def is_durable_statement(text: str) -> bool:
    """A first-person statement worth keeping (I mostly write Go and a bit of Rust; 我养了一条狗叫旺财)."""
    t = _lead_stripped(text.strip())
    if not t or len(t) > 200 or t.rstrip().endswith(("?", "？", "吗")) or _PASSING.search(t):
        return False
    if carries_instruction(t) or _NOT_DURABLE.match(t.replace("’", "'")):
        return False
    return _DURABLE_ZH.match(t) is not None or _DURABLE_EN.match(t.replace("’", "'")) is not None
