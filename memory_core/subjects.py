"""Deterministic subject recogniser: which changeable attribute a sentence sets, and to what value
(`recognise`); the subject tables and questions every path shares are in `policy`."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from .policy import HAN, canonical_subject, subject_type


@dataclass(frozen=True)
class Recognised:
    """What a sentence sets: a canonical subject, the value as the user wrote it, and the entry type."""

    subject: str
    value: str
    type: str


def _words(text: str, sep: str | None = None) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(sep) if w.strip())


_ZH_PLACES = _words(
    """北京 天津 上海 重庆 河北 山西 辽宁 吉林 黑龙江 江苏 浙江 安徽 福建 江西 山东 河南 湖北 湖南 广东 海南 四川
    贵州 云南 陕西 甘肃 青海 台湾 内蒙古 广西 西藏 宁夏 新疆 香港 澳门 杭州 广州 深圳 南京 苏州 成都 武汉 西安 长沙
    郑州 青岛 厦门 宁波 无锡 合肥 福州 济南 大连 沈阳 哈尔滨 长春 昆明 南昌 贵阳 南宁 太原 石家庄 兰州 乌鲁木齐
    拉萨 银川 西宁 呼和浩特 海口 三亚 珠海 东莞 佛山 温州 绍兴 嘉兴 常州 徐州 烟台 泉州 惠州 中山 南通 扬州 保定
    洛阳 桂林 丽江 大理 义乌 台北 高雄 余杭 萧山 滨江 浦东 朝阳 海淀 中关村 望京 南山 福田 硅谷 纽约 伦敦 巴黎
    东京 大阪 首尔 柏林 慕尼黑 旧金山 洛杉矶 西雅图 波士顿 芝加哥 多伦多 温哥华 悉尼 墨尔本 新加坡 曼谷 迪拜 吉隆坡
    莫斯科 罗马 米兰 马德里 巴塞罗那 阿姆斯特丹 苏黎世 日内瓦 维也纳 日本 韩国 加拿大 澳大利亚 新西兰 欧洲 美洲"""
)
_EN_PLACES = _words(
    """beijing, shanghai, shenzhen, guangzhou, hangzhou, chengdu, wuhan, nanjing, suzhou, xi'an, chongqing,
    tianjin, hong kong, macau, taipei, singapore, tokyo, osaka, kyoto, seoul, bangkok, hanoi, manila, jakarta,
    kuala lumpur, mumbai, delhi, bangalore, dubai, istanbul, moscow, london, paris, berlin, munich, hamburg,
    frankfurt, amsterdam, brussels, zurich, geneva, vienna, prague, warsaw, stockholm, oslo, copenhagen, helsinki,
    dublin, edinburgh, madrid, barcelona, lisbon, rome, milan, athens, cairo, lagos, nairobi, cape town, sydney,
    melbourne, auckland, toronto, vancouver, montreal, new york, nyc, san francisco, los angeles, seattle, boston,
    chicago, austin, denver, miami, atlanta, portland, mexico city, sao paulo, buenos aires, lima, bogota,
    bay area, silicon valley, china, japan, korea, south korea, india, france, germany, italy, spain, uk, england,
    scotland, ireland, usa, us, america, canada, australia, new zealand, brazil, mexico, russia, netherlands,
    switzerland, sweden, norway, thailand, vietnam, taiwan, europe, asia""",
    ",",
)
#: The place vocabulary, shared with the upsert's meaning judge (`meaning`).
ZH_PLACES, EN_PLACES = _ZH_PLACES, _EN_PLACES
_ZH_PLACE_SUFFIX = tuple("区市省县镇村乡路街道州国岛湾弄巷号")
# Momentary whereabouts and generic nouns: 我在家 / 我在公司 say nothing about where someone is based.
_ZH_GENERIC = _words(
    """家 家里 老家 公司 单位 学校 办公室 宿舍 医院 路上 车上 外面 外地 这 这里 这儿 这边 那 那里 那儿 那边 楼下
    楼上 网上 线上 线下 本地 附近 床上 国内 市区 郊区 小区 园区 景区 一个 某个"""
)
_ZH_ACTIVITY = _words(
    """开会 吃饭 工作 上班 加班 出差 睡觉 休息 考虑 思考 准备 排队 开车 坐车 上课 上学 读书 学习 旅游 旅行 度假
    散步 健身 锻炼 处理 测试 调试 写 想 忙 吃 喝 睡 看 玩 读 听 找 买 等 搞 弄 聊 做 干 打 跑 洗 跟 和 给 帮 用 赶
    逛 哭 笑 努力 犹豫 纠结 发呆 面试 复习 考试 讨论 研究 参加 这 那 某 一个"""
)
_EN_STOP = _words(
    """a an my your his her our their this that it love trouble charge bed pain shock luck class school hospital
    no good bad debt tears heaven hell doubt danger control meeting line queue progress touch range time shape
    town transit office work home night nights weekends weekend myself free fun money hours least most living
    tomorrow later back anytime maybe sometime whenever now please not tired fine ok okay here there ready happy
    sorry sure what when where why how secret none unknown he she they we you i me everyone nobody someone the
    just also still really so very glad excited busy bored hungry sick lost confused new chinese american british
    english french german japanese korean indian canadian australian"""
)
# First characters and words that cannot start a name: pronouns, errands (我叫了外卖), time words, conjunctions
# (如果我住在北京 is a hypothetical, not a person called 如果我).
_ZH_NOT_NAME = _words(
    """用户 他 她 它 我 你 您 这 那 谁 某 有 每 别 人 一 了 过 车 醒 起 吃 回 去 来 出 睡 周末 今天 明天 昨天 平时 以前
    现在 目前 最近 如果 要是 假如 虽然 因为 但是 所以 可能 也许 听说 据说 好像 感觉 觉得 希望 打算 准备 想 还 都 就
    只 也 才 又"""
)
_ZH_NOT_NAME_WORDS = _words("同事 朋友 公司 老板 外卖 快递 出租车 救护车 名字 大家 别人 有人")
_QUESTION_WORDS = re.compile(r"哪|什么|啥|谁|几|多少|怎么|\b(?:where|what|which|who|whom)\b", re.I)
_TZ = re.compile(
    r"(?:utc|gmt)(?:\s*[+-]\s*\d{1,2}(?::?\d{2})?)?|[东西](?:十[一二]|[一二三四五六七八九十])区|零时区|"
    r"[a-z]+/[a-z_]+(?:/[a-z_]+)?|[pmce][sd]t|cest|cet|bst|jst|kst|ist|aest|aedt|hkt|sgt|wet|eet|msk|"
    r"(?:北京|东京|首尔|新加坡|伦敦|巴黎|纽约|美东|美西|美中|太平洋|大西洋|东部|中部|山地|格林尼治|欧洲中部|中国标准)"
    r"(?:标准)?(?:时间|时区)|(?:pacific|eastern|central|mountain|atlantic|alaska|hawaii)(?: standard| daylight)?"
    r"(?: time)?(?: ?zone)?",
    re.I,
)

_TAIL = re.compile(r"(?:[了啦呢哦喔呀啊吧嘛噢哟耶]|[\s.!~,;:、。…\"'“”‘’」』》)\]])+$")
_EN_TAIL = re.compile(
    r"\s+(?:now|right now|currently|these days|nowadays|at the moment|for now|as well|too|already|anymore|lol|"
    r"haha|btw|though|actually|officially|full[- ]time|thanks|thank you|please|from now on|going forward)$",
    re.I,
)
# English values end at the first connector: "I live in Paris with my wife since 2020" -> Paris.
_EN_CUT = re.compile(
    r"\s+(?:because|since|until|for|with|where|which|who|when|as|at|in|on|from|but|so|though|while|after|before|"
    r"starting|last|this|next|and (?:i|i'm|my|we|it|he|she|they))\b.*$",
    re.I,
)
_ZH_CUT = re.compile(
    r"(?:(?:已经|都|快|有|差不多)*(?:几|好|好多|很多|半|[0-9一二两三四五六七八九十百]+)个?多?(?:年|月|周|天|星期|小时)"
    r"[多了啦]*|这边|那边|这里|那里|附近|一带)$"
)


def _clean(value: str, english: bool, cut: bool = True) -> str:
    """Trim quotes, trailing fillers (了/啦/呢/now/lol…), durations (三年了) and, in English, connectors."""
    if english and cut:
        value = _EN_CUT.sub("", value)
    previous = None
    while previous != value:
        previous = value
        value = _TAIL.sub("", value.strip().lstrip("\"'“‘「『《(（[ "))
        value = _EN_TAIL.sub("", value) if english else _ZH_CUT.sub("", value)
    return value.strip()


def _zh_place(value: str) -> bool:
    """A Chinese place: a known place (optionally plus a short district: 北京朝阳), or a 区/市/路… suffix."""
    if not 2 <= len(value) <= 20 or value in _ZH_GENERIC or _QUESTION_WORDS.search(value):
        return False
    for place in _ZH_PLACES:
        if value.startswith(place):
            rest = value[len(place) :].lstrip("的")
            if not rest or (len(rest) <= 3 and not rest.startswith(_ZH_ACTIVITY)):
                return True
    if value.startswith(_ZH_ACTIVITY):
        return False
    if len(re.findall(rf"[{HAN}]", value)) < 2 or not value.endswith(_ZH_PLACE_SUFFIX):
        return False
    return re.fullmatch(rf"[{HAN}0-9A-Za-z· ]+", value) is not None


def _en_place(value: str) -> bool:
    """An English place: a known place, or a capitalised proper noun that is no idiom (I'm in love)."""
    bare = re.sub(r"^the\s+", "", value, flags=re.I)
    if value.lower() in _EN_PLACES or bare.lower() in _EN_PLACES:
        return True
    words = bare.split()
    if not words or len(value) > 60 or words[0].lower() in _EN_STOP or _QUESTION_WORDS.search(value):
        return False
    return words[0][0].isupper() and all(ch.isalpha() or ch in " .,'-" for ch in value)


def _is_tz(value: str, english: bool = False) -> bool:
    bare = re.sub(r"^the\s+|\s*(?:time ?zone|时区)$", "", value, flags=re.I)
    return any(_TZ.fullmatch(v) for v in (value, bare, bare.replace(" ", "")))


def _name_ok(value: str, strict: bool) -> bool:
    """A person's name: 2–4 CJK characters that are no pronoun or errand (我叫了外卖), or 1–3 Latin words."""
    if _QUESTION_WORDS.search(value):
        return False
    if re.fullmatch(rf"[{HAN}]{{2,4}}|[{HAN}]+·[{HAN}·]+", value):
        return not value.startswith(_ZH_NOT_NAME) and value not in _ZH_NOT_NAME_WORDS
    if not re.fullmatch(r"[A-Za-z][A-Za-z'.-]*(?: [A-Za-z][A-Za-z'.-]*){0,2}", value):
        return False
    words = value.split()
    return words[0].lower() not in _EN_STOP and (not strict or all(w[0].isupper() for w in words))


def _any_value(value: str, english: bool = False) -> bool:
    return len(value) <= 60 and not _QUESTION_WORDS.search(value)


def _employer_ok(value: str, english: bool = False) -> bool:
    if not _any_value(value) or value in _ZH_GENERIC or value.split()[0].lower() in _EN_STOP:
        return False
    return not value.startswith(_ZH_ACTIVITY) and not value.endswith("的")


_TESTS: dict[str, Callable[[str, bool], bool]] = {
    "any": _any_value,
    "place": lambda v, en: _en_place(v) if en else _zh_place(v),
    "tz": _is_tz,
    "lang": lambda v, en: True,
    "techy": lambda v, en: (
        _any_value(v) and re.search(r"[A-Za-z]", v) is not None and v.split()[0].lower() not in _EN_STOP
    ),
    "name": lambda v, en: _name_ok(v, strict=False),
    "strictname": lambda v, en: _name_ok(v, strict=True),
    "employer": _employer_ok,
    "capemployer": lambda v, en: _employer_ok(v) and v[0].isupper(),
    "joined": lambda v, en: (
        _employer_ok(v) and not re.search(r"(?:会|群|队|俱乐部|社|班|房|组|计划|活动)$", v)
    ),
}

#: Who a person's relations are, as a regex alternation (我女儿…, 王芳是我的同事): a statement about one of them
#: is about the person's life too (`intents.is_durable_statement`).
ZH_RELATIONS = (
    "联合创始人|创始人|合伙人|同事|老板|上司|领导|经理|主管|导师|老师|同学|好朋友|朋友|闺蜜|室友|邻居|客户|"
    "助理|妻子|老婆|丈夫|老公|女朋友|男朋友|对象|爱人|爸爸|妈妈|父亲|母亲|儿子|女儿|哥哥|姐姐|弟弟|妹妹|表哥|表姐|"
    "表弟|表妹|叔叔|阿姨|爷爷|奶奶|外公|外婆|爸妈|父母|孩子|宝宝|CEO|CTO|HR|队友"
)
_ZH_REL_WORDS = tuple(ZH_RELATIONS.split("|"))

# One rule per line: language, subject, test, anchored pattern; `{…}` are macros, named groups v = value,
# n = a third party's name. Order is precedence: 我在东八区 is a time zone, 我在阿里巴巴工作 an employer.
_MACROS = {
    "{ADV}": "(?:现在|目前|如今|最近|已经|也|还|就|一直|平时|都|刚|刚刚)*",
    "{ADV_EN}": r"(?:(?:now|currently|still|actually|also|just|recently|finally|officially)\s+)*",
    "{I_AM}": r"i(?:'m|\s+am|m)",
    "{ZH_TO}": "(?:请|麻烦你?|你|可以|能不能|可不可以|能|以后|之后|今后|接下来|从现在(?:开始|起)|从今(?:天|以后)?(?:开始|起)?)*",
    "{EN_TO}": r"(?:please |pls |kindly |(?:could|can|would) you (?:please )?|from now on,? |going forward,? )*",
    "{LANG}": r"(?P<v>简体中文|繁体中文|中文|汉语|普通话|简体|繁体|英文|英语|日语|日文|韩语|韩文|法语|德语|西班牙语|俄语|粤语|"
    r"葡萄牙语|意大利语|阿拉伯语|越南语|泰语|(?:(?:simplified |traditional )?chinese|english|mandarin|cantonese|"
    r"japanese|korean|french|german|spanish|russian|portuguese|italian|arabic|hindi|vietnamese|thai|dutch)\b)",
    "{ZH_REL}": ZH_RELATIONS,
    "{HAN}": HAN,
    "{EN_REL}": r"co-?founder|founder|partner|colleague|co-?worker|boss|manager|best friend|friend|roommate|"
    r"flatmate|neighbou?r|client|assistant|teacher|mentor|wife|husband|girlfriend|boyfriend|fianc[eé]e?|spouse|"
    r"mom|mum|dad|mother|father|son|daughter|brother|sister|cousin|uncle|aunt|grandma|grandpa|ceo|cto|teammate",
    "{NAME_ZH}": rf"(?P<n>[{HAN}·]{{2,4}}?|[A-Z][a-z]+)",
    "{NAME_EN}": r"(?P<n>[A-Za-z][a-z]+(?: [A-Z][a-z]+)?)",
}
_RULE_TABLE = r"""
zh 时区 any ^我的?(?:所在)?时区(?:现在|目前)?(?:是|为|在|:)?\s*(?P<v>.+)$
zh 时区 tz ^我(?:这边|这里|那边)?{ADV}人?(?:在|用|是|处于|位于|使用)(?P<v>.+)$
en 时区 any ^my (?:time ?zone|tz)(?:'s| is|:)\s*(?P<v>.+)$
en 时区 tz ^{I_AM} (?:(?:on|in|using) )?(?P<v>.+)$
zh 语言 lang ^{ZH_TO}(?:都|就|也|还是|请|尽量|一律)*(?:用|使用|说|讲|改用|换成|切换到|切换成){LANG}来?(?:回复|回答|答复|和我|跟我|说话|聊天|聊|交流|沟通|对话|写|说|吧|我|哦|呢|了|可以|好)*$
zh 语言 lang ^我{ADV}(?:更|比较|还是)?(?:喜欢|偏好|倾向于?|习惯|希望)你?(?:用|使用|说|讲)?{LANG}(?:回复|回答|交流|沟通|聊天|对话)?(?:一些|一点|多一点)?$
zh 语言 lang ^我的?(?:偏好|首选|常用|回复)?语言(?:偏好)?(?:是|为|:){LANG}$
en 语言 lang ^{EN_TO}(?:always )?(?:answer|reply|respond|talk|speak|write|chat|communicate|text)(?: to me| with me| back)?(?: only)? in {LANG}(?: please| from now on| going forward| only)*$
en 语言 lang ^i(?: would|'d)? prefer (?:(?:to )?(?:talk|speak|chat|communicate|write)(?:ing)? )?(?:in )?{LANG}(?: please| from now on)?$
en 语言 lang ^i(?:'d| would) like (?:you to )?(?:answer|reply|respond|talk|speak)(?: to me)? in {LANG}$
en 语言 lang ^my (?:preferred|default|reply) language is {LANG}$
en 语言 lang ^(?:let's|let us) (?:talk|speak|chat|communicate|switch to|use)(?: in)? {LANG}$
en 语言 lang ^(?:use|switch to) {LANG}(?: please| from now on)?$
zh 技术栈 any ^我的?(?:主要|现在的|目前的)?(?:技术栈|编程语言|开发语言|主力语言)(?:主要)?(?:是|为|:|包括)(?P<v>.+)$
zh 技术栈 any ^我{ADV}(?:主要|平时|一般|日常|基本|通常)*都?(?:用|使用|拿)(?P<v>.+?)来?(?:开发|编程|写代码|写程序|做开发|写后端|写前端|搞开发)$
zh 技术栈 techy ^我{ADV}(?:主要|平时|一般|日常|基本|通常)+(?:写|搞)(?P<v>.+)$
zh 技术栈 techy ^我是(?:写|搞|做)(?P<v>.+?)(?:开发)?的$
en 技术栈 any ^my (?:tech(?:nology)? )?stack(?:'s| is|:)\s*(?P<v>.+)$
en 技术栈 techy ^my (?:main |primary )?programming languages? (?:is|are) (?P<v>.+)$
en 技术栈 techy ^i {ADV_EN}(?:(?:mainly|mostly|primarily|usually|normally) )?(?:code|program|develop|write code) (?:mainly |mostly |primarily )?in (?P<v>.+)$
en 技术栈 techy ^i (?:(?:mainly|mostly|primarily|usually) )?use (?P<v>.+?) for (?:development|coding|programming|dev)$
zh 姓名 name ^我的?(?:名字|姓名|全名|大名)(?:是|叫|:)(?P<v>.+)$
zh 姓名 name ^我叫(?P<v>.+)$
zh 姓名 name ^(?:你|您)?(?:以后)?(?:可以|就|请|都)*叫我(?P<v>.+?)(?:就行|就好|就可以|即可|好了)了?$
zh 姓名 name ^(?:你|您)?(?:以后|可以|请)+(?:就|都)?叫我(?P<v>.+)$
en 姓名 name ^my (?:full |first |real |preferred )?name(?:'s| is) (?P<v>.+)$
en 姓名 strictname ^(?:you can |please |just )*call me (?P<v>.+?)(?: please| from now on| instead)?$
en 姓名 strictname ^i go by (?P<v>.+)$
zh - work_at ^我{ADV}(?:在|于)(?P<v>.+?)(?:工作|上班|任职|就职|供职|打工|实习|当\S{1,6})$
zh 雇主 employer ^我{ADV}(?:就职于|任职于|供职于|工作于|服务于|受雇于|入职了?|跳槽到了?|跳槽去了?)(?P<v>.+?)(?:工作|上班)?$
zh 雇主 joined ^我{ADV}加入了?(?P<v>.+?)(?:工作|上班)?$
zh 雇主 employer ^我的?(?:现在的|目前的)?(?:雇主|公司|单位|工作单位|东家|就职单位)(?:现在|目前)?(?:是|为|:)(?P<v>.+)$
zh 雇主 employer ^我{ADV}是(?P<v>.+?)的(?:员工|职员|一员|工程师|程序员|产品经理|设计师|研究员|实习生)$
en 雇主 employer ^i {ADV_EN}work (?:at|for) (?P<v>.+)$
en 雇主 employer ^{I_AM} {ADV_EN}(?:working|employed) (?:at|for|by|with) (?P<v>.+)$
en 雇主 capemployer ^i(?:'ve| have)? {ADV_EN}joined (?P<v>.+?)(?: as .+)?$
en 雇主 employer ^i(?:'ve| have)? {ADV_EN}(?:got|landed|accepted|started) (?:a|my|a new|my new) (?:job|position|role|gig) (?:at|with) (?P<v>.+)$
en 雇主 employer ^my (?:current )?(?:employer|company)(?:'s| is) (?P<v>.+)$
en 雇主 capemployer ^{I_AM} an? (?:[\w+#.-]+ ){0,3}(?:engineer|developer|designer|manager|scientist|analyst|researcher|consultant|intern|lead|director|architect|programmer|pm|cto|ceo|founder|employee) (?:at|for|with) (?P<v>.+)$
zh 所在地 any ^我的?(?:所在地|居住地|住址|地址|住处|所在城市|居住城市|城市|坐标|位置|常住地)(?:现在|目前)?(?:是|在|为|:)?(?P<v>.+)$
zh 所在地 place ^我?(?:现在|目前)?坐标(?P<v>.+)$
zh 所在地 place ^我{ADV}人?(?:住在|住|居住在|居住于|定居在|定居于|生活在|常驻|常住在?|长住在?)(?P<v>.+)$
zh - moved ^我{ADV}(?:搬家|搬)了?(?:到|去|来)了?(?P<v>.+)$
zh 所在地 place ^我{ADV}(?:又|已经)?(?:回到|搬回|搬回到|回)了?(?P<v>.+)$
zh 所在地 place ^我{ADV}人?(?:在|于)(?P<v>.+)$
en 所在地 place ^i {ADV_EN}(?:live|reside) (?:in|at) (?P<v>.+)$
en 所在地 place ^{I_AM} {ADV_EN}(?:living|residing|based|located|settled|staying) (?:in|at|out of) (?P<v>.+)$
en 所在地 place ^i(?:'ve| have) {ADV_EN}been (?:living|based) in (?P<v>.+)$
en 所在地 place ^i(?:'ve| have)? {ADV_EN}(?:moved|relocated) (?:back )?to (?P<v>.+)$
en 所在地 place ^{I_AM} {ADV_EN}in (?P<v>.+)$
en 所在地 any ^my (?:current )?(?:location|city|home|address|residence)(?:'s| is) (?P<v>.+)$
zh 家乡 any ^我的?(?:老家|家乡|籍贯){ADV}(?:是|在|:)(?P<v>.+)$
zh 家乡 place ^我(?:是|也是)?来自(?P<v>.+)$
zh 家乡 place ^我(?:是|也是)(?P<v>.+?)人$
en 家乡 place ^{I_AM} (?:originally )?from (?P<v>.+)$
en 家乡 place ^i (?:grew up|was raised) in (?P<v>.+)$
en 家乡 any ^my (?:hometown|home town)(?:'s| is) (?P<v>.+)$
zh - person ^{NAME_ZH}是(?P<v>我们?的?(?:公司|团队|部门|项目|组)?的?(?:{ZH_REL}))$
zh - person ^(?P<v>我们?的?(?:公司|团队|部门)?的?(?:{ZH_REL}))叫(?P<n>[{HAN}·]{2,4}|[A-Z][a-z]+)$
zh - person ^(?:我们?的?)?(?:{ZH_REL}){NAME_ZH}(?P<v>(?:现在|目前|也|一直)?(?:住在|在|是|就职于|搬到|搬去).+)$
zh - person ^{NAME_ZH}(?P<v>(?:现在|目前|也|一直)?(?:住在|定居在|搬到了?|搬去了?|就职于).+)$
en - person ^{NAME_EN}(?: is|'s) (?P<v>my (?:[\w-]+ ){0,2}(?:{EN_REL}))$
en - person ^my (?:[\w-]+ )?(?:{EN_REL}),? {NAME_EN},? (?P<v>(?:now |just |recently |also )*(?:lives|is based|works|moved|is|has)\b.+)$
en - person ^(?P<v>my (?:{EN_REL}))(?:'s name)? is (?:called |named )?{NAME_EN}$
en - person ^{NAME_EN} (?P<v>(?:now |just |recently |also )*(?:lives in|is based in|works (?:at|for)|moved to)\b.+)$
"""
Rule = tuple[re.Pattern[str], str, str, bool]


def _compile(line: str) -> Rule:
    lang, subject, test, pattern = line.split(" ", 3)
    for macro, expansion in _MACROS.items():
        pattern = pattern.replace(macro, expansion)
    return (re.compile(pattern, re.I if lang == "en" else 0), subject, test, lang == "en")


_RULES = [_compile(line) for line in _RULE_TABLE.strip().splitlines()]
# A question sets nothing, except a polite language request (可以用英文回复吗 / can you answer in English?).
_REQUEST_RULES = [rule for rule in _RULES if rule[2] == "lang"]


def _apply(rule: Rule, clause: str) -> tuple[str, str] | None:
    pattern, subject, test, english = rule
    m = pattern.match(clause)
    if m is None:
        return None
    value = _clean(m["v"], english, cut=test != "person")
    if test == "person":
        return _person(m["n"].strip(), value)
    if test == "work_at":  # 我在X工作: X is where one works when it is a place, else the employer
        subject = "所在地" if _zh_place(value) else "雇主"
        test = "place" if subject == "所在地" else "employer"
    elif test == "moved":  # 我搬到杭州工作了 / 我搬去深圳了
        value = _clean(
            re.sub(r"(?:工作|上班|读书|上学|生活|定居|发展|创业|养老|居住|住|去|来)$", "", value), False
        )
        subject, test = "所在地", "place"
    return (subject, value) if value and _TESTS[test](value, english) else None


def _person(name: str, value: str) -> tuple[str, str] | None:
    """A named third party: ``person:<name>`` with the rest of the clause as value. Pronouns are refused."""
    if not value or name.lower() in _EN_STOP or name in _ZH_NOT_NAME_WORDS or name in _ZH_REL_WORDS:
        return None
    if name.startswith(_ZH_NOT_NAME) or re.search("[我你您他她它们]|[都也还就又才的了在是和跟]$", name):
        return None  # 他/如果我/老婆孩子都…: a pronoun, a conjunction or a clause, not a name
    if name.isascii() and not all(w[0].isupper() for w in name.split()):
        return None
    return (canonical_subject("person:" + name), value)


# Single-character fillers need a space after them: 对象小红住在北京 does not start with 对.
_LEAD_ZH = re.compile(
    r"^(?:对了|其实|那个|顺便(?:说|提)?一?下?|告诉你|跟你说|和你说|说一?下|更新一?下|另外|还有|好消息|是的|没错|最近|"
    r"现在|目前|如今|今年|从现在开始|从今天(?:开始|起))\s*:?\s*|^(?:对|嗯+|哦+|噢|啊|诶|哎)(?:\s+|$)"
)
_LEAD_EN = re.compile(
    r"^(?:btw|by the way|fyi|so|well|actually|also|oh|hey|hi|hello|ok|okay|anyway|just so you know|quick update|"
    r"update|good news|news|these days|nowadays|currently|now|as of (?:today|now|this (?:week|month|year)))\b[\s:!-]*",
    re.I,
)
_GREETING_NAME = re.compile(
    rf"^(?:hi|hello|hey|你好|您好|大家好|嗨|哈喽)(?: there| all| everyone)?[\s,!.~]*(?:i(?:'m| am) |我是)"
    rf"(?P<v>[A-Za-z][a-z'-]+(?: [A-Za-z][a-z'-]+)?|[{HAN}·]{{2,4}}?)\s*(?:[,.!。].*)?$",
    re.I,
)
_OCCUPATION_END = (*"员师生家者人长工手总官", "新来的")
_SPLIT = re.compile(r"([,;!?\n~、。…]+|\.+(?=\s|$))")


def _clauses(text: str) -> list[tuple[str, bool]]:
    """(clause, is_question) pairs with leading fillers (对了, btw…) removed; ? or 吗 ends a question."""
    parts = _SPLIT.split(text)
    out = []
    for i in range(0, len(parts), 2):
        sep = parts[i + 1] if i + 1 < len(parts) else ""
        clause, previous = parts[i].strip(), ""
        while previous != clause:
            previous = clause
            clause = _LEAD_EN.sub("", _LEAD_ZH.sub("", clause)).strip()
        question = "?" in sep or clause.endswith("吗")
        clause = re.sub(r"(?:好吗|可以吗|行吗|吗)$", "", clause) if question else clause
        if clause := _TAIL.sub("", clause):
            out.append((clause, question))
    return out


def recognise(text: str) -> Recognised | None:
    """The first attribute a message sets, or None. Deterministic and total: never raises, and never files a
    third party's fact under the user."""
    norm = " ".join(unicodedata.normalize("NFKC", text[:1000]).replace("’", "'").replace("‘", "'").split())
    greeting = _GREETING_NAME.match(norm)
    if greeting and _name_ok(greeting["v"], True) and not greeting["v"].endswith(_OCCUPATION_END):
        return Recognised("姓名", greeting["v"], "identity")
    for clause, question in _clauses(norm):
        for rule in _REQUEST_RULES if question else _RULES:
            if hit := _apply(rule, clause):
                return Recognised(hit[0], hit[1], subject_type(hit[0]))
    return None
