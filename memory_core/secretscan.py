"""The secret detector: finds credentials and personal identifiers in text before anything is stored.
Its rules, what it lets through and its known gaps: docs/RELIABILITY.md ("The secret scanner")."""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from functools import partial

from .policy import HAN
from .similarity import char_class


@dataclass(frozen=True)
class SecretFinding:
    """One secret: what it is, and the span of the secret value in the scanned text."""

    kind: str
    start: int
    end: int


Span = tuple[int, int, str]

# Overlapping findings merge into one span named after the most specific member, so that redaction never
# leaves a piece of a secret behind ("token=ghp_…" is both a contextual token and a GitHub token).
_PRIORITY = {"private_key": 100, "cn_id_number": 80, "bank_card": 70, "connection_string": 60}
_PRIORITY |= {"bearer_token": 50, "feishu_secret": 45, "password": 40, "pin": 40, "api_key": 40}
_PRIORITY |= {"generic_token": 10}
_FORMAT_PRIORITY = 90  # every fixed token format (jwt, aws_key, github_token, …)

# --- what a generated secret looks like ------------------------------------------------------------------

_PIECES = re.compile(r"[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_HEX = frozenset("0123456789abcdefABCDEF-")
# Identifiers that look random but are public: Feishu app/open/chat/message ids, Stripe publishable keys, SSH
# public key blobs.
_PUBLIC_PREFIXES = ("cli_", "ou_", "on_", "oc_", "om_", "pk_live_", "pk_test_", "AAAAB3NzaC1", "AAAAC3NzaC1")


def _wordish(v: str) -> bool:
    """Mostly lowercase words between separators: a path, slug or name ("/open-apis/bot/v3/info")."""
    return sum(len(w) for w in re.split(r"[^A-Za-z0-9]+", v) if len(w) >= 3 and w.isalpha()) >= 0.6 * len(v)


def _machine_made(v: str) -> bool:
    """Generated rather than typed: long enough, digits and letters, varied, not made of words."""
    letters_and_digits = any("0" <= c <= "9" for c in v) and any(c.isascii() and c.isalpha() for c in v)
    return len(v) >= 8 and letters_and_digits and len(set(v)) >= 5 and not _wordish(v)


def _random_enough(v: str, min_len: int = 20, allow_hex: bool = False) -> bool:
    """High-entropy and not made of words: what an unlabelled token looks like."""
    if len(v) < min_len or not _machine_made(v) or v.startswith(_PUBLIC_PREFIXES):
        return False
    if not allow_hex and set(v) <= _HEX:  # commit hashes, checksums, UUIDs: identifiers, not credentials
        return False
    # camelCase names, slugs and paths ("getAccessTokenForUser2", "my-secret-token-2024") have long letter
    # runs; random tokens switch between classes every one or two characters.
    pieces = _PIECES.findall(v)
    entropy = -sum(c / len(v) * math.log2(c / len(v)) for c in Counter(v).values())
    return sum(map(len, pieces)) / len(pieces) < 3.0 and entropy >= 3.3


def _varied(s: str) -> bool:
    return len(set(s)) >= 8 and any("0" <= c <= "9" for c in s)


def _jwt_ok(tok: str) -> bool:
    head = tok.split(".", 1)[0]
    if len(head) > 2000:  # real headers are a few hundred characters; refuse to decode a flood
        return False
    try:
        obj = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        return False
    return isinstance(obj, dict) and "alg" in obj


_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_PROVINCES = frozenset((11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 35, 36, 37, 41, 42, 43, 44, 45, 46))
_PROVINCES |= frozenset((50, 51, 52, 53, 54, 61, 62, 63, 64, 65, 71, 81, 82, 83, 91))


def cn_id_valid(s: str) -> bool:
    """GB 11643: a known province code, a birth date in 1900-2099, the ISO 7064 MOD 11-2 check character."""
    if len(s) != 18 or not s[:17].isdigit() or int(s[:2]) not in _PROVINCES:
        return False
    try:
        born = date(int(s[6:10]), int(s[10:12]), int(s[12:14]))
    except ValueError:
        return False
    total = sum(int(c) * w for c, w in zip(s, _ID_WEIGHTS, strict=False))
    return 1900 <= born.year <= 2099 and "10X98765432"[total % 11] == s[17].upper()


def luhn_valid(digits: str) -> bool:
    doubled = (int(c) * 2 if i % 2 else int(c) for i, c in enumerate(reversed(digits)))
    return sum(d - 9 if d > 9 else d for d in doubled) % 10 == 0


# --- fixed formats: tokens and ID numbers ----------------------------------------------------------------

_B = r"(?<![A-Za-z0-9_-])"  # the token starts here, not inside a longer word
_FORMATS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "aws_key": (r"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])",
                lambda s: len(set(s)) >= 8),
    "github_token": (_B + r"(?:gh[pousr]_[A-Za-z0-9]{30,}+|github_pat_[A-Za-z0-9_]{30,}+)", _varied),
    "gitlab_token": (_B + r"glpat-[A-Za-z0-9_-]{20,}+", _varied),
    "slack_token": (_B + r"(?:xox[abposr]-[A-Za-z0-9-]{10,}+"
                    r"|https://hooks\.slack\.com/services/[A-Za-z0-9/]{20,}+)", _varied),
    "stripe_key": (_B + r"(?:[sr]k_(?:live|test)_[A-Za-z0-9]{16,}+|whsec_[A-Za-z0-9]{24,}+)", _varied),
    "anthropic_key": (_B + r"sk-ant-[A-Za-z0-9_-]{20,}+", _varied),
    "openai_key": (_B + r"sk-(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}+",
                   lambda s: _random_enough(re.sub(r"^sk-(?:proj-|svcacct-|admin-)?", "", s), 20, True)),
    "google_api_key": (_B + r"AIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])", _varied),
    "jwt": (_B + r"eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{4,}+\.[A-Za-z0-9_-]*+", _jwt_ok),
    "feishu_token": (_B + r"(?:[tu]-[A-Za-z0-9_-]{30,}+|https://open\.(?:feishu\.cn|larksuite\.com)"
                     r"/open-apis/bot/v2/hook/[A-Za-z0-9-]{20,}+)",
                     lambda s: s.startswith("https://") or _random_enough(s[2:], 30, allow_hex=True)),
    "cn_id_number": (r"(?<![0-9])[1-9][0-9]{16}[0-9Xx](?![0-9])", cn_id_valid),
    "api_key": (_B + r"(?:hf_[A-Za-z0-9]{30,}+|npm_[A-Za-z0-9]{36,}+|pypi-AgE[A-Za-z0-9_-]{50,}+"
                r"|SG\.[A-Za-z0-9_-]{20,}+\.[A-Za-z0-9_-]{20,}+)", _varied),
}  # fmt: skip
# One pass for all formats: their starts are disjoint, so at most one alternative can match at a position.
# Each starts with a letter or digit: the lookahead skips every other position (Chinese text) at once.
_FORMAT_RE = re.compile(
    "(?=[A-Za-z0-9])(?:" + "|".join(f"(?P<{k}>{rx})" for k, (rx, _) in _FORMATS.items()) + ")"
)


def _formats(text: str) -> Iterator[Span]:
    for m in _FORMAT_RE.finditer(text):
        kind = m.lastgroup or ""
        if _FORMATS[kind][1](m.group()):
            yield m.start(), m.end(), kind


_PEM_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]++ ){0,3}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]{0,40}+-----")
_PEM_CHUNK = re.compile(r"\s*+((?:Proc-Type|DEK-Info|Comment|Version):[^\n]*+|[A-Za-z0-9+/=]++)")


def _pem(text: str) -> Iterator[Span]:
    no_end_after = len(text) + 1  # once an END search fails, later ones would fail too: keep it linear
    pos = 0
    while m := _PEM_BEGIN.search(text, pos):
        e = _PEM_END.search(text, m.end()) if m.end() < no_end_after else None
        if e:
            body, end = text[m.end() : e.start()], e.end()
        else:  # a truncated paste: the block runs on while lines look like base64 (or PEM headers)
            no_end_after = min(no_end_after, m.end())
            end = m.end()
            while (c := _PEM_CHUNK.match(text, end)) and not (len(c[1]) < 16 and c[1].isalpha()):
                end = c.end()
            body = text[m.end() : end]
        # A header alone ("the file starts with -----BEGIN …") reveals nothing; a body does.
        if sum(ch.isascii() and ch.isalnum() for ch in body) >= 16:
            yield m.start(), end, "private_key"
        pos = max(end, m.end())


# Backtracking here is bounded: at most 19 groups, and a separator is only taken when a digit follows.
_CARD = re.compile(r"(?<![0-9])[0-9](?:[ -]?[0-9]){12,18}(?![0-9])")
_CARD_CONTEXT = re.compile(r"(?i)卡|card|visa|master|amex|银联|unionpay|账号|帐号|account")
# Numbers people do want remembered: orders, parcels, invoices, phones, books, staff ids.
_NOT_CARD_CONTEXT = re.compile(
    r"(?i)订单|单号|运单|快递|物流|发票|流水|交易号|工号|学号|编号|票号|电话|手机|微信|"
    r"order|tracking|invoice|phone|tel\b|isbn|serial|ticket|qq"
)


def _card_network(d: str) -> bool:
    """The prefix and length of a real card network: Visa, Mastercard, Amex, UnionPay, JCB, Discover…"""
    n, p2 = len(d), d[:2]
    if d[0] == "4" or "51" <= p2 <= "55" or "2221" <= d[:4] <= "2720":
        return n in (13, 16, 19) if d[0] == "4" else n == 16
    if p2 in ("34", "37"):
        return n == 15
    if p2 in ("62", "35", "65") or d[:4] == "6011" or "644" <= d[:3] <= "649":
        return 16 <= n <= 19
    return p2 in ("30", "36", "38") and n in (14, 16)


def _cards(text: str) -> Iterator[Span]:
    for m in _CARD.finditer(text):
        raw = m.group()
        digits = re.sub(r"[ -]", "", raw)
        groups = [len(g) for g in re.split(r"[ -]", raw)]
        # Cards are written ungrouped or in fours (Amex 4-6-5); "+86 138 1234 5678" is not a card.
        if len(groups) > 1 and (
            len(set(raw) - set("0123456789")) > 1
            or not (groups == [4, 6, 5] or (all(g == 4 for g in groups[:-1]) and groups[-1] <= 4))
        ):
            continue
        near = text[max(0, m.start() - 24) : m.start()] + " " + text[m.end() : m.end() + 8]
        card_words = bool(_CARD_CONTEXT.search(near))
        if not luhn_valid(digits) or (_NOT_CARD_CONTEXT.search(near) and not card_words):
            continue
        # A network prefix suffices; card wording also admits odd lengths, but never a 19xx/20xx date.
        if _card_network(digits) or (card_words and digits[0] in "3456"):
            yield m.start(), m.end(), "bank_card"


# --- contextual values: "密码是 …", "password: …", "DB_PASSWORD=…", "Authorization: Bearer …" ---------------
# Matched in two steps (secret word and separator, then value): a long rejected value is skipped.

# The value: in double or CJK quotes (a passphrase), in single quotes (no spaces: "password's strength"
# is no quote), or a bare run of password characters; CJK and sentence punctuation end it, and so does
# a URL query's next "&name=".
_VALUE_MAX = 256
_VALUE = re.compile(
    r"[\"“「『](?P<qv>[^\"”」』\n]{1,64}+)[\"”」』]|['`‘](?P<qs>[^'`’\s]{1,128}+)['`’]"
    r"|(?:[!#$%*+\-./0-9:=?@A-Z\\^_a-z|~]|&(?![A-Za-z_][A-Za-z0-9_]{0,30}+=)){1,256}+"
)


def _en(alts: str) -> str:
    return rf"(?<![A-Za-z0-9_])(?:{alts})(?![A-Za-z])"


# Services whose "key", "token" or "secret" is a credential alone ("OpenAI key …", "飞书 token …"):
# the providers of gitleaks' and trufflehog's rules plus the Chinese clouds and model vendors (2026-12).
_SERVICES = (
    r"feishu|lark|飞书|aws|amazon|azure|gcp|google|gemini|openai|anthropic|claude|deepseek|moonshot|kimi|"
    r"zhipu|智谱|dashscope|通义|qwen|百炼|文心|ernie|baidu|百度|aliyun|alibaba|阿里云|tencent|腾讯云|qcloud|"
    r"huawei|华为云|volcengine|火山引擎|dingtalk|钉钉|wechat|weixin|微信|企业微信|wecom|alipay|支付宝|github|"
    r"gitlab|bitbucket|slack|discord|telegram|stripe|paypal|twilio|sendgrid|mailgun|cloudflare|heroku|"
    r"vercel|netlify|digitalocean|linode|notion|jira|atlassian|docker|npm|pypi|hugging[ ]?face|hf|"
    r"mapbox|shopify|firebase|supabase|datadog|sentry|okta|auth0|ollama|replicate|cohere|mistral|groq"
)
_SERVICE_NEAR = re.compile(rf"(?i)(?<![A-Za-z])(?:{_SERVICES})(?![A-Za-z])")
_KW_KINDS: tuple[str, ...] = ("service_key", "aws_key", "feishu_secret", "private_key", "api_key")
_KW_KINDS += ("generic_token", "pin", "password")
_IS = r"ist|lautet|war|es|era|est|était|é"  # "is" in the languages whose password words are listed
_PHRASE_SOURCE = (
    r"(?:(?P<aws_key>" + _en(r"aws[ _-]?secret[ _-]?(?:access[ _-]?)?key|secret[ _-]access[ _-]key") + ")"
    r"|(?P<feishu_secret>" + _en(r"app[ _-]?secret|encrypt[ _-]?key|verification[ _-]?token") + ")"
    # "<service> [api|app|…] key|token|secret": after the two above, which name their own kind
    r"|(?P<service_key>(?<![A-Za-z0-9_])(?:" + _SERVICES + r")(?:[ _-]?(?:api|app|bot|access|secret|"
    r"encrypt|signing|webhook|bearer|auth))?[ _-]?(?:key|token|secret)s?(?![A-Za-z]))"
    r"|(?P<private_key>私钥|" + _en(r"private[ _-]?key") + ")"
    r"|(?P<api_key>密钥|秘钥|金钥|"
    + _en(r"api[ _-]?key|access[ _-]?key(?:[ _-]?id)?|secret[ _-]?key|(?:client|signing)[ _-]?secret|secret")
    + ")"
    r"|(?P<generic_token>令牌|" + _en(r"(?:(?:access|refresh|auth|api|bot|session)[ _-]?)?token") + ")"
    r"|(?P<pin>安全码|" + _en(r"pin(?:[ _-]?(?:code|number)|[ ]?码)?|cvv2?|cvc2?") + ")"
    r"|(?P<password>密码|口令|暗号|暗码|密语|提取码|授权码|解锁码|锁屏码|门禁码|开锁码|开门码|"
    + _en(
        r"passwords?|passwd|pwd|(?<![.-])pw(?![0-9])|passcode|pass[ ]?phrase|pass[ ]?key|master[ ]password|app[ ]password|"
        r"(?:access|door|alarm|unlock|gate)[ ]code|mot[ ]de[ ]passe|passwort|kennwort|contrase(?:ñ|n)a|senha"
    )
    + "))"
    # "password for the wifi is …", "password of my gmail account: …" (only when a separator follows)
    # (and in German, Spanish, French, Portuguese: "Passwort für das WLAN ist …", "contraseña del wifi es …")
    r"(?P<qual>[ \t]++(?:for|of|on|to|für|vom?|zum|del?|para|pour|du)[ \t]++"
    r"(?:(?:my|the|our|your|this|that|mein(?:e[ns]?)?|das|der|die|mi|el|la|mon|ma|le|o|a)[ \t]++)?"
    r"[A-Za-z0-9_.@-]{1,40}+(?:[ \t]++(?!(?:is|was|to|" + _IS + r")[ \t])[A-Za-z0-9_.@-]{1,40}+)?"
    r"(?=[ \t]*+(?:is|was|" + _IS + r"|[:：=])))?"
    r"(?P<sep>[ \t\u3000]*+(?:(?P<w>(?<![A-Za-z])(?:is(?:[ \t]++now)?|was|to|" + _IS + r")(?![A-Za-z]))"
    r"|(?:也|还|都|就|应该)?是|为|為|(?:改|换|设|设置)(?:成|为)了?|:=|=>|[:：=＝])"
    r"[ \t\u3000]*+(?:[:：][ \t\u3000]*+)?)?[ \t\u3000]*+"
)
# Every match starts with an ASCII letter or the first character of a Chinese word above: a lookahead
# on that class skips any other position at once (a page of Chinese: milliseconds, not most of a second).
_PHRASE_FIRST = "".join(sorted({w[0] for w in re.findall(rf"[{HAN}]+", _PHRASE_SOURCE)}))
_PHRASE = re.compile(f"(?=[A-Za-z{_PHRASE_FIRST}])" + _PHRASE_SOURCE, re.IGNORECASE)
_IDENT = re.compile(
    r"(?<![A-Za-z0-9_.$-])([\"']?)(?P<name>[A-Za-z_][A-Za-z0-9_.-]{0,63}+)\1[ \t]*+(?::=|=>|[:=：])[ \t]*+"
)


def _words(s: str) -> frozenset[str]:
    return frozenset(s.split())


_NAME_PARTS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
# Names that describe a secret rather than hold one: password_policy, token_url, secret_name, max_key…
_META = _words(
    "policy length len min max hint reset expiry expires expire expired expiration ttl timeout rule rules "
    "strength type format field label prompt required enabled count limit url uri endpoint file path dir "
    "env name id ids header param tenant primary sort partition foreign cache idempotency public pub routing "
    "object hash index event message"
)
_STOPWORDS = _words(
    "required optional none null nil empty true false unknown incorrect wrong invalid expired reset changed "
    "hidden same different correct strong weak protected encrypted hashed masked saved stored forgotten "
    "please here below above field policy length manager managers needed missing blank every any all some "
    "this that these those not see"
)
_SELF_NAMES = _words("password passwd pwd pass secret token")  # `password = password`, `user:password@`
_PLACEHOLDER = re.compile(
    r"(?i)^(?:\$[A-Za-z{(]|<|%\(|\{\{|\[REDACTED|your|example|placeholder|dummy|sample)|^[*xX#._-]+$"
)
_PATH_OR_CODE = re.compile(r"^(?:/|~/|\.\.?/|[A-Za-z]:\\)|://|^[A-Za-z_]+(?:\.[A-Za-z_]+)+$")
_WORDY = re.compile(r"[A-Za-z]+(?:[-'][A-Za-z]+)*")
_UNIT_OR_CALL = re.compile(
    r"[(\[]|[ \t]*+(?:(?:characters?|chars?|digits?|letters?|symbols?|bits?|bytes?|times?|days?|hours?"
    r"|minutes?|months?|years?)(?![A-Za-z])|位|个|次|天|年|月|日|号|小时|分钟|秒|字|元|块|岁)",
    re.IGNORECASE,
)
# Hyphenated words that describe a password rather than being one ("password: case-sensitive").
_HYPHEN_PROSE = _words(
    "case-sensitive case-insensitive one-time read-only write-only built-in two-factor auto-generated "
    "well-known user-defined self-service single-use non-empty server-side client-side long-lived "
    "short-lived hard-coded re-entered re-set e-mail wi-fi"
)
_ONE_TIME = ("one-time ", "one time ", "otp ", "动态", "一次性", "短信")
_FEISHU_WORDS = re.compile(r"(?i)飞书|feishu|lark")


def _one_time(text: str, i: int) -> bool:
    """The secret word at `i` is qualified as a one-time code, which is not worth blocking (see top)."""
    return text[max(0, i - 9) : i].lower().endswith(_ONE_TIME)


def _value_ok(kind: str, v: str, how: str, after: str) -> bool:
    """Does `v`, after a secret word, look like the secret itself? `how`: assign, word (is/was/to), bare
    (nothing between), bare-cjk (nothing after a Chinese word), quoted (after a separator), quoted-bare."""
    if not v or _PLACEHOLDER.search(v) or _PATH_OR_CODE.search(v) or v.lower() in _SELF_NAMES:
        return False
    if _UNIT_OR_CALL.match(after):  # "password 8 characters", "password = input(…)"
        return False
    if kind == "pin":
        return how in ("quoted", "assign", "word") and v.isdigit() and 3 <= len(v) <= 12
    if kind == "password":
        if len(v) < 4 or v.lower() in _STOPWORDS or (v.isdigit() and how == "bare"):
            return False
        if (
            how == "foreign"
        ):  # a word after "ist", "es", "est" may describe it (falsch, incorrecta): not taken
            return _WORDY.fullmatch(v) is None
        if how == "quoted":
            return True
        if " " in v:  # 'the password "reset link"': a quoted phrase needs a separator before it
            return False
        if _WORDY.fullmatch(v):  # a word after "is" or with no separator is prose ("password is incorrect")
            # …but words joined by hyphens after a separator are a passphrase (correct-horse-battery)
            joined = v.count("-") >= (1 if how == "assign" else 2) and v.lower() not in _HYPHEN_PROSE
            return (
                (how in ("assign", "word") and joined)
                or (how == "assign" and v.isalpha())
                or (how == "word" and _a_word_password(v, after))
            )
        if how.startswith("bare"):  # "密码 123456", "password hunter2" -- but not "password 2 times"
            return any(c.isdigit() for c in v) and (how == "bare-cjk" or len(v) >= 6)
        return True
    if how == "bare-service":  # a named service's key with no separator: it must look generated
        return _machine_made(v) and not set(v) <= _HEX
    # Keys and tokens must be explicitly assigned and look machine-made, or — right after their word, with
    # nothing between ("令牌 sk8Hq2LmP0xZ", "token x7Kp2Lm9Qr"; not hex: ids) — look random as well.
    if how not in ("quoted", "assign", "word"):
        return _random_enough(v, 10)
    return _random_enough(v, 16, allow_hex=True) if kind == "weak_key" else _machine_made(v)


# "my password is dragon": one word after is/was that ends the sentence is the password, unless it describes
# one (incorrect, expired, weak) — a listed word or the shape of an English adjective or participle.
_ADJECTIVE_END = re.compile(r"(?:ed|ing|able|ible|ful|less|ous|ive|ent|ant|ish|al|ic|ary|ory|ly)\Z")
_PREDICATES = _words(
    "right real fake fine mine yours his hers ours theirs gone lost known unknown private public secret "
    "safe unsafe easy hard simple good bad great ok okay new old long short weird same done over back off "
    "ready set clear obvious unique generic common standard basic strange funny stupid silly dumb smart "
    "clever nice cool awesome terrible horrible lame boring alright stronger weaker longer shorter better "
    "worse safer easier harder simpler newer older "
    "expire change reset update remember protect access unlock enter login logon type use keep work"
)
_CLAUSE_END = re.compile(r"[ \t]*+(?:[.!?,;，。！？；\n]|\Z)")


def _a_word_password(v: str, after: str) -> bool:
    w = v.lower()
    if not v.isalpha() or not _CLAUSE_END.match(after) or _ADJECTIVE_END.search(w):
        return False
    return not (w in _DESCRIBING or w in _FUNCTION_WORDS or w in _PREDICATES or w in _UNIT_WORDS)


def _contextual(
    text: str, head: re.Pattern[str], classify: Callable[[re.Match[str]], tuple[str, str] | None]
) -> Iterator[Span]:
    """The values after `head` matches (a secret word and its separator) that look like the secret."""
    pos = 0
    while m := head.search(text, pos):
        pos = m.end()
        if (c := classify(m)) is None:
            continue
        if (phrase := _phrase_value(text, pos, *c, cjk_word=text[m.start()] > "~")) is not None:
            yield phrase[0], phrase[1], "password"
            pos = phrase[1]
            continue
        if (v := _VALUE.match(text, pos)) is None:
            continue
        (kind, how), group = c, "qv" if v["qv"] else "qs" if v["qs"] else 0
        quoted = group != 0
        how = ("quoted" if how in ("assign", "word") else "quoted-bare") if quoted else how
        s, e = v.span(group)
        while not quoted and e > s and text[e - 1] in ".:":  # sentence punctuation, not part of the value
            e -= 1
        if _value_ok(kind, text[s:e], how, text[e + quoted : e + 12]):
            yield s, e, "api_key" if kind == "weak_key" else kind
            pos = e
        elif e - s >= _VALUE_MAX:  # do not re-scan a long run from every secret word inside it
            pos = e


# A password in Chinese characters (我的密码是芝麻开门) or of spaced words after a Chinese separator: taken
# only when it ends the clause (or the sentence goes on about it: …别告诉别人), never when it describes
# the password (a question, a quality, a hint, a count).
_CJK_AFTER = (
    r"别(?:告诉|跟|让|说|外传|泄露|忘)|不要(?:告诉|跟|说|外传|泄露|忘)|千万|记得|记住|帮我|你(?:记|帮|别)"
)
_CJK_PIECE = rf"(?:(?!{_CJK_AFTER})[{HAN}]|[#$%*+\-/0-9=@A-Z^_a-z~]){{1,32}}+"
_CJK_VALUE = re.compile(
    rf"{_CJK_PIECE}(?:[ \u3000]{_CJK_PIECE}){{0,3}}+"
    rf"(?=[ \t\u3000]*+(?:[，。！？、,.!?;；)）\n]|$|{_CJK_AFTER}))"
)
_HAN = re.compile(f"[{HAN}]")
_SPACED_WORD = r"[!#$%*+\-./0-9=?@A-Z^_a-z~]{1,64}+"
_SPACED = re.compile(
    rf"{_SPACED_WORD}(?:[ \u3000]{_SPACED_WORD}){{1,5}}+(?=[ \t\u3000]*+(?:[，。！？,!?;；\n]|\.?$))"
)
_CJK_PROSE = re.compile(
    "[的了吗呢么啥哪几我你他她它这那不没很太挺位个对错空忘改换]|多少|什么|怎么|如何|一样|相同|同一|正确|默认|初始|"
    "生日|手机|身份|号码|加密|安全|重要|保密|隐私|必须|必填|需要|可以|简单|复杂|数字|字母|符号|随机|自动|统一|公开|"
    "固定|用户|名字|账号|邮箱|之前|以前|原来|以后|现在|设置|告诉|知道|一致|有效|过期|失效|区分|大小写|提示"
)
_UNIT_WORDS = _words("characters character chars digits digit letters symbols bits bytes times days")


def _phrase_value(text: str, pos: int, kind: str, how: str, cjk_word: bool) -> tuple[int, int] | None:
    """The span of a password that the ASCII value pattern cannot take: Chinese characters, or spaced
    words after a Chinese separator. None when there is none (the caller then tries `_VALUE`)."""
    if kind != "password" or how not in ("assign", "word"):
        return None
    cv = _CJK_VALUE.match(text, pos)
    if cv is not None and _HAN.search(cv.group()):  # an ASCII-only value is `_VALUE`'s to judge
        v = cv.group()
        return None if len(v) < 2 or _CJK_PROSE.search(v) else cv.span()
    if cjk_word and how == "assign" and (sv := _SPACED.match(text, pos)) is not None:
        words = [w.lower() for w in sv.group().split()]
        # a passphrase may hold a describing word (correct horse battery staple), not be made of them
        if not any(w in _SELF_NAMES or w in _UNIT_WORDS for w in words) and not _describes(words):
            s, e = sv.span()
            return s, e - (text[e - 1] == ".")
    if not cjk_word and (ev := _EN_SPACED.match(text, pos)) is not None and _passphrase(ev.group().split()):
        return ev.span()
    return None


# Spaced English words after an English secret word and "is", "was", "to" or ":": a passphrase
# when they end the clause, none is a function word, unit or adverb (the password is *in the* drawer),
# and at most a third describe a password (case sensitive, very strong); the lists come from a survey.
_EN_WORD = r"[!#$%*+\-/0-9=?@A-Z^_a-z~]{1,64}+"
_EN_SPACED = re.compile(rf"{_EN_WORD}(?:[ ]{_EN_WORD}){{1,5}}+(?=[ \t]*+(?:[,!?;:)\n，。！？；]|\.(?!\S)|$))")
_FUNCTION_WORDS = _words(
    "a an the my your his her its our their this that these those some any every each no none all both "
    "either neither another other such what which who whom whose where when why how whatever "
    "i me you he him she it we us they them mine yours ours theirs myself yourself itself "
    "to in on at by for from of off out over under into onto upon with without within about above below "
    "after before between behind beside near through across along around against among per via than "
    "and or but nor so yet if because unless until while though although whether "
    "is are was were be been being am do does did done has have had having can could will would shall "
    "should may might must not never no nothing something anything everything someone anyone "
    "too very so quite pretty really rather fairly super extremely kind sort bit little lot least most "
    "more less much many few enough just only also even still already again always often sometimes "
    "soon now then later today yesterday tomorrow here there somewhere anywhere everywhere away back "
    "up down ever else like same as last next safely easily simply barely rarely daily weekly monthly yearly"
)
_DESCRIBING = _STOPWORDS | _words(
    "short long weak strong secure insecure safe unsafe easy hard simple complex complicated sensitive "
    "insensitive unique random generated temporary old new default obvious memorable good bad great fine "
    "ok okay known shared written lost compromised leaked stolen locked working broken valid outdated "
    "updated set changed expiring required case letters numbers symbols special uppercase lowercase mixed "
    "day week month year night morning evening"
)


def _adverb(word: str) -> bool:
    """-ly of seven letters or more (securely, randomly): shorter ones are as often names (Lily, Emily)."""
    return len(word) >= 7 and word.endswith("ly")


def _passphrase(words: list[str]) -> bool:
    lowered = [w.lower().strip(".") for w in words]
    if not all(any(c.isalnum() for c in w) for w in lowered):  # "== confirm_password": an operator
        return False
    if any("=" in w for w in lowered[1:]):  # "password=hunter22 secret=Xy9…": the next assignment, not a word
        return False
    if any(w in _FUNCTION_WORDS or w in _SELF_NAMES or w in _UNIT_WORDS or _adverb(w) for w in lowered):
        return False
    if any(w.isdigit() for w in lowered) and all(w.isdigit() or w in _DESCRIBING for w in lowered):
        return False  # "8 characters", "12 or more": counts (digits alone are the ASCII value's)
    return not _describes(lowered) and len("".join(lowered)) >= 6


def _describes(words: list[str]) -> bool:
    """More than a third of `words` describe a password (case sensitive, very strong): prose, not one."""
    return 3 * sum(w in _DESCRIBING for w in words) > len(words)


def _classify_phrase(m: re.Match[str]) -> tuple[str, str] | None:
    text, kind = m.string, next(k for k in _KW_KINDS if m[k] is not None)
    kw_start = m.start(kind)
    word = (m["w"] or "").lower()
    if _one_time(text, kw_start):
        return None
    if word == "to" and kind != "password":  # "set the token to x7K…" as with nothing between; a pin never
        return kind, "bare"
    if kind == "service_key":
        token = m[kind].lower().rstrip("s").endswith("token")
        kind = (
            "feishu_secret"
            if _FEISHU_WORDS.match(text, kw_start)
            else "generic_token"
            if token
            else "api_key"
        )
        how = "word" if word else "assign" if m["sep"] else "bare-service"
        return kind, how
    if kind == "api_key" and _FEISHU_WORDS.search(text, max(0, kw_start - 40), kw_start):
        kind = "feishu_secret"
    if not m["sep"] and kind != "password" and _SERVICE_NEAR.search(text, max(0, kw_start - 24), kw_start):
        return kind, "bare-service"  # "OpenAI api key abc…", "飞书 encrypt key EK-…": named, no separator
    if not m["sep"] and kind == "feishu_secret":
        return kind, "bare-service"
    if word and kind == "password" and word.split()[0] not in ("is", "was", "to"):
        return kind, "foreign"  # "Passwort ist …": no list of its describing words here, see _value_ok
    return kind, "word" if word else "assign" if m["sep"] else "bare-cjk" if text[kw_start] > "~" else "bare"


_NAME_WORDS = (
    ("aws_key", ("secretaccesskey",)),
    ("feishu_secret", ("appsecret", "encryptkey", "verificationtoken")),
    ("password", ("password", "passwd", "passphrase", "passcode")),
    ("private_key", ("privatekey",)),
    ("api_key", ("secret", "apikey", "accesskey", "authkey")),
)


def _name_kind(name: str) -> str | None:
    """What a variable or field called `name` holds, judged by the words in it (DB_PASSWORD, apiKey…)."""
    flat = re.sub(r"[^a-z0-9]", "", name.lower())
    if not any(w in flat for w in ("pas", "pw", "secret", "token", "key", "credential", "pin")):
        return None  # the common case, decided cheaply
    parts = {p.lower() for p in _NAME_PARTS.findall(name)}
    if parts & _META:
        return None
    for kind, words in _NAME_WORDS:
        if any(w in flat for w in words):
            return kind
    if parts & {"pwd", "pass", "pw"}:
        return "password"
    if parts & {"token", "credential", "credentials"}:
        return "generic_token"
    return "pin" if "pin" in parts else "weak_key" if "key" in parts else None


def _classify_ident(m: re.Match[str]) -> tuple[str, str] | None:
    kind = _name_kind(m["name"])
    if kind is None or _one_time(m.string, m.start("name")):
        return None
    return kind, "word" if m["name"].lower() in ("pass", "pw") else "assign"  # "Pass = every …" is prose


_AUTH = re.compile(
    r"(?i)(?<![A-Za-z0-9_-])(?:authorization[\"']?[ \t]*+[:=][ \t]*+[\"']?(?P<scheme>bearer|basic|token)?"
    r"|bearer(?=[ \t]))[ \t]*+(?P<val>[A-Za-z0-9._~+/=-]{8,}+)"
)
_URL_CRED = re.compile(
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{1,19}+://[^\s:/?#@\[\]]{0,64}+:(?P<pw>[^\s/?@\[\]]{1,128}+)@"
)


def _auth(text: str) -> Iterator[Span]:
    for m in _AUTH.finditer(text):
        if _machine_made(m["val"]) and not _PLACEHOLDER.search(m["val"]):
            basic = (m["scheme"] or "").lower() == "basic"  # base64 of user:password
            yield m.start("val"), m.end("val"), "password" if basic else "bearer_token"


def _url_creds(text: str) -> Iterator[Span]:
    for m in _URL_CRED.finditer(text):
        if not _PLACEHOLDER.search(m["pw"]) and m["pw"].lower() not in _SELF_NAMES:
            yield m.start("pw"), m.end("pw"), "connection_string"


# --- unlabelled high-entropy strings next to a secret-ish word -------------------------------------------

_CANDIDATE = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/_-]{20,}+=*+")  # "=" only as base64 padding
_NEAR_WORD = re.compile(
    r"(?i)(?<!public )(?<!public_)(?<!publishable )"
    + _en(r"(?:api[ _-]?)?keys?|tokens?|secrets?|credentials?|passwords?")
    + "|密钥|秘钥|金钥|令牌|私钥|凭证|凭据|口令|密码"
)


def _generic(text: str) -> Iterator[Span]:
    words = [m.span() for m in _NEAR_WORD.finditer(text)]
    starts, ends = [w[0] for w in words], [w[1] for w in words]
    for m in _CANDIDATE.finditer(text) if words else ():
        s, e = m.span()
        # A secret word ending at most 40 characters before the string, or starting at most 20 after it.
        near = bisect.bisect_left(ends, s - 40) < bisect.bisect_right(ends, s)
        near = near or bisect.bisect_left(starts, e) < bisect.bisect_right(starts, e + 20)
        in_url = "://" in re.split(r"\s", text[max(0, s - 200) : s])[-1]  # a URL path, not a credential
        if near and not in_url and _random_enough(m.group()):
            yield s, e, "generic_token"


# An AWS secret access key has no prefix of its own, but it comes with its key id (AKIA…): a random
# 40-character string near one is the secret, whatever words stand around it.
_AWS_ID = re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_AWS_NEAR = 200


def _aws_pairs(text: str) -> Iterator[Span]:
    for m in _AWS_ID.finditer(text):
        for c in _AWS_SECRET.finditer(text, max(0, m.start() - _AWS_NEAR), m.end() + _AWS_NEAR):
            if _machine_made(c.group()) and not set(c.group()) <= _HEX:  # a commit hash is no key
                yield c.start(), c.end(), "aws_key"


_DETECTORS: tuple[Callable[[str], Iterator[Span]], ...] = (
    _pem,
    _formats,
    _aws_pairs,
    _cards,
    _url_creds,
    _auth,
    partial(_contextual, head=_IDENT, classify=_classify_ident),
    partial(_contextual, head=_PHRASE, classify=_classify_phrase),
    _generic,
)


# --- what a secret is read as: full-width and styled letters, invisible characters, traditional forms ------

# Characters that hide nothing when dropped (a zero-width space inside "pass\u200bword" or a value).
_INVISIBLE = frozenset("\u00ad\u180e\u200b\u200c\u200d\u2060\ufeff")
# The traditional forms of the characters of the Chinese secret words above (密碼, 金鑰, 憑證, 設為…).
_TRADITIONAL = str.maketrans("碼號語權鎖門開鑰憑證據設換為", "码号语权锁门开钥凭证据设换为")


# Chinese punctuation the patterns read as written: most Chinese text needs no folding at all.
_AS_WRITTEN = frozenset("，！？；：（）")


def _fold_class() -> re.Pattern[str]:
    """One character class of every character `_fold` changes: NFKC changes it (ｐａｓｓ, ＝, 𝐩), it is
    invisible, or a traditional form above. Built once; a text without any is scanned as it is."""
    cps = (
        cp
        for cp in (*range(0x80, 0x10000), *range(0x1D400, 0x1D800))  # and the mathematical letters
        if not 0xD800 <= cp < 0xE000
        and chr(cp) not in _AS_WRITTEN
        and (
            chr(cp) in _INVISIBLE or unicodedata.normalize("NFKC", chr(cp)).translate(_TRADITIONAL) != chr(cp)
        )
    )
    return re.compile(char_class(cps))


_FOLDS = _fold_class()


def _fold(text: str) -> tuple[str, list[int] | None]:
    """`text` as the detectors read it, and for each of its characters the index it came from (None: as
    given). A secret typed in full-width letters, with a zero-width space or as 密碼 is still one."""
    if text.isascii() or _FOLDS.search(text) is None:
        return text, None
    parts: list[str] = []
    origin: list[int] = []
    last = 0
    for m in _FOLDS.finditer(text):
        at = m.start()
        parts.append(text[last:at])
        origin.extend(range(last, at))
        ch = m.group()
        folded = "" if ch in _INVISIBLE else unicodedata.normalize("NFKC", ch).translate(_TRADITIONAL)
        parts.append(folded)
        origin.extend([at] * len(folded))
        last = at + 1
    parts.append(text[last:])
    origin.extend(range(last, len(text)))
    return "".join(parts), origin


def find_secrets(text: str) -> list[SecretFinding]:
    """Every secret in `text`: non-overlapping, sorted by start; each span covers the secret value."""
    folded, origin = _fold(text)
    spans = sorted(span for detect in _DETECTORS for span in detect(folded) if span[0] < span[1])
    if origin is not None:  # back to the text as given: from the first to the last character it came from
        spans = [(origin[s], origin[e - 1] + 1, kind) for s, e, kind in spans]
    merged: list[Span] = []
    for s, e, kind in spans:
        if merged and s < merged[-1][1]:
            ps, pe, pk = merged[-1]
            better = _PRIORITY.get(kind, _FORMAT_PRIORITY) > _PRIORITY.get(pk, _FORMAT_PRIORITY)
            merged[-1] = (ps, max(pe, e), kind if better else pk)
        else:
            merged.append((s, e, kind))
    return [SecretFinding(kind, s, e) for s, e, kind in merged]


def contains_secret(text: str) -> bool:
    return bool(find_secrets(text))


_MARKER = re.compile(r"\[REDACTED:[a-z_]{1,40}\]")


def holds_redaction(text: str) -> bool:
    """`text` carries a redaction marker: a statement about a secret that was cut out (an extraction or a
    replay reads the redacted archive). Stored, it would say nothing, and two of them would look alike."""
    return _MARKER.search(text) is not None


def redact(text: str) -> str:
    """`text` with each secret replaced by ``[REDACTED:<kind>]``; text without findings is unchanged."""
    for _ in range(8):
        found = find_secrets(text)
        if not found:
            break
        out, last = [], 0
        for f in found:
            out += [text[last : f.start], f"[REDACTED:{f.kind}]"]
            last = f.end
        out.append(text[last:])
        text = "".join(out)
    return text


def redact_long(text: str, window: int = 1 << 16, context: int = 8192) -> tuple[str, int]:
    """`redact` for a text of any length, and how many secrets it cut; scanned in overlapping windows, so
    an edge-crossing secret is found and a long scan never holds the interpreter for seconds."""
    if len(text) <= window:
        clean = redact(text)
        return clean, len(find_secrets(text)) if clean != text else 0
    spans: list[Span] = []
    for base in range(0, len(text), window):
        lo = max(0, base - context)
        for f in find_secrets(text[lo : base + window + context]):
            start, end = lo + f.start, lo + f.end
            if base <= start < base + window and (not spans or start >= spans[-1][1]):
                spans.append((start, end, f.kind))
    out, last = [], 0
    for start, end, kind in spans:
        out += [text[last:start], f"[REDACTED:{kind}]"]
        last = end
    out.append(text[last:])
    return "".join(out), len(spans)
