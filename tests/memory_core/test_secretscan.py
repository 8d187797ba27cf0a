"""The secret detector against its corpus, plus properties that must hold for any text at all."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_core.secretscan import (
    SecretFinding,
    cn_id_valid,
    contains_secret,
    find_secrets,
    luhn_valid,
    redact,
    redact_long,
)

from .secret_corpus import BENIGN, ORDER_NUMBER, POSITIVES, Positive, card, cn_id, luhn_ok


def test_corpus_is_large_enough() -> None:
    assert len(POSITIVES) >= 220
    assert len(BENIGN) >= 80
    assert len({p.id for p in POSITIVES}) == len(POSITIVES)
    assert len({i for i, _ in BENIGN}) == len(BENIGN)


@pytest.mark.parametrize("case", POSITIVES, ids=lambda c: c.id)
def test_secret_is_found_and_redacted(case: Positive) -> None:
    assert case.text.count(case.secret) == 1, "corpus case must hold its secret exactly once"
    start = case.text.index(case.secret)
    end = start + len(case.secret)
    found = find_secrets(case.text)
    covering = [f for f in found if f.start < end and start < f.end]
    assert covering, f"not detected: {case.text!r}"
    assert covering[0].kind in case.kinds, f"{covering[0].kind} not in {sorted(case.kinds)}"
    out = redact(case.text)
    assert case.secret not in out
    # Exactly the secret goes: every character before and after it survives.
    before, after = case.text[:start], case.text[end:]
    assert out.startswith(before) and out.endswith(after), out
    assert out == before + f"[REDACTED:{covering[0].kind}]" + after


@pytest.mark.parametrize(("text"), [pytest.param(t, id=i) for i, t in BENIGN])
def test_benign_text_passes(text: str) -> None:
    assert find_secrets(text) == []
    assert not contains_secret(text)
    assert redact(text) == text


# --- the corpus helpers agree with the module's checksums ------------------------------------------------


def test_order_number_in_corpus_fails_luhn() -> None:
    assert not luhn_ok(ORDER_NUMBER)
    assert not luhn_valid(ORDER_NUMBER)


def test_checksum_helpers_agree() -> None:
    for prefix, n in [("4", 16), ("622202", 19), ("37", 15), ("5", 16)]:
        number = card(prefix, n)
        assert luhn_ok(number) and luhn_valid(number)
        broken = number[:-1] + str((int(number[-1]) + 1) % 10)
        assert not luhn_valid(broken)
    assert luhn_valid("4111111111111111")
    ident = cn_id("110105", "19491231", "002")
    assert ident == "11010519491231002X"
    assert cn_id_valid(ident) and cn_id_valid(ident.lower())
    assert not cn_id_valid("110105194912310021")  # wrong check character
    assert not cn_id_valid(cn_id("110105", "19490230", "002"))  # February 30th
    assert not cn_id_valid(cn_id("990105", "19490101", "002"))  # no such province
    assert not cn_id_valid(cn_id("110105", "18490101", "002"))  # implausible birth year


# --- behaviour worth stating on its own ------------------------------------------------------------------


def test_contextual_span_is_the_value() -> None:
    assert redact("我的密码是 hunter2") == "我的密码是 [REDACTED:password]"
    assert redact("password: xyz12, user alice") == "password: [REDACTED:password], user alice"
    assert redact("my pin is 4821.") == "my pin is [REDACTED:pin]."


def test_several_secrets_in_one_message() -> None:
    text = "账号 bob 密码 hunter2x，身份证 11010519491231002X，token=ghp_" + "a1B2c3D4e5" * 4
    kinds = [f.kind for f in find_secrets(text)]
    assert kinds == ["password", "cn_id_number", "github_token"]
    assert redact(text) == (
        "账号 bob 密码 [REDACTED:password]，身份证 [REDACTED:cn_id_number]，token=[REDACTED:github_token]"
    )


def test_pem_without_end_is_one_finding() -> None:
    body = "\n".join("MIIEowIBAAKCAQEA" + "x9Yz" * 12 for _ in range(3))
    text = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n\nthanks"
    found = find_secrets(text)
    assert [(f.kind, f.start) for f in found] == [("private_key", 0)]
    assert redact(text) == "[REDACTED:private_key]\n\nthanks"


def test_an_aws_secret_key_is_found_next_to_its_key_id_without_a_secret_word() -> None:
    """The key id has a format (AKIA…); the 40-character secret has none and was stored in clear when
    pasted beside it with no word such as "secret"."""
    key_id, secret = "AKIAZ3MQ7PLX4RT8NB2Q", "9fKq2+Lm7xP0vRt3sWz8YbN1cQe5HjU4gA6dTo2M"
    for text in (f"{key_id} {secret}", f"我的 AWS 账号: {key_id} / {secret}，别外传", f"{secret}\n{key_id}"):
        assert redact(text).count("[REDACTED:aws_key]") == 2 and secret not in redact(text), text
    commit = "3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e"  # a commit hash beside one is no key
    assert commit in redact(f"commit {commit} added {key_id}")
    assert find_secrets(secret) == []  # alone it is any random string


def test_specific_kind_wins_when_detectors_overlap() -> None:
    text = "OPENAI_API_KEY=sk-proj-" + "Ab3dE5fG7hJ9kL1m" * 4
    assert [f.kind for f in find_secrets(text)] == ["openai_key"]


def test_unicode_and_surrogates_do_not_break_spans() -> None:
    text = "\ud800 密码：Abc12345 \U0001f600"
    (f,) = find_secrets(text)
    assert text[f.start : f.end] == "Abc12345"


def test_long_adversarial_lines_finish() -> None:
    # No timing assertion here (CI machines vary); the point is that these return at all. Each is shaped to
    # make a backtracking pattern go quadratic or worse.
    lines = [
        "a" * 10_000,
        "1" * 10_000,
        "1 " * 5_000,
        "password: " * 1_000,
        "密码是" * 3_000,
        "-----BEGIN RSA PRIVATE KEY-----" * 300,
        "-----BEGIN RSA PRIVATE KEY-----\n" + "A" * 10_000,
        "eyJ" * 3_000 + ".",
        "ghp_" * 2_500,
        "a:" * 5_000,
        "x://" * 2_500,
        "token " + "Ab3_" * 2_500,
        "&" * 10_000,
        "password=" + "a&" * 5_000,
    ]
    for line in lines:
        for f in find_secrets(line):
            assert 0 <= f.start < f.end <= len(line)


# --- each rule of the contextual detector, at its edges (found by mutation testing, docs/TESTING.md) -----
# What the user sees is the stored text: the secret cut out and named, or the fact left as it was said.

RULES = [
    # a PIN is 3 to 12 digits, assigned, quoted or after "is"; bare ("pin 4821") it is a reference, not a PIN
    ("pin-quoted", 'PIN: "4821"', 'PIN: "[REDACTED:pin]"'),
    ("pin-3-digits", "pin: 482", "pin: [REDACTED:pin]"),
    ("pin-2-digits", "pin: 48", "pin: 48"),
    ("pin-12-digits", "pin: 482113579246", "pin: [REDACTED:pin]"),
    ("pin-13-digits", "pin: 4821135792461", "pin: 4821135792461"),
    ("pin-bare", "pin 4821", "pin 4821"),
    ("pin-is", "pin is 4821", "pin is [REDACTED:pin]"),
    ("pin-not-digits", "pin: 48a1", "pin: 48a1"),
    ("pin-to-a-year", "pin to 2024", "pin to 2024"),
    ("cvv", "cvv: 123", "cvv: [REDACTED:pin]"),
    ("pin-code-cjk", "PIN码: 4821", "PIN码: [REDACTED:pin]"),
    # a password is 4 characters or more, not a stop word, not a bare number
    ("password-3-chars", "password: abc", "password: abc"),
    ("password-4-chars", "password: ab1!", "password: [REDACTED:password]"),
    ("password-stop-word", "password: required", "password: required"),
    ("password-bare-number", "password 123456", "password 123456"),
    ("password-assigned-number", "password: 123456", "password: [REDACTED:password]"),
    ("password-quoted-phrase", 'password: "hello world"', 'password: "[REDACTED:password]"'),
    ("password-quoted-after-is", 'my password is "two words"', 'my password is "[REDACTED:password]"'),
    ("password-quoted-3-chars", 'password: "abc"', 'password: "abc"'),
    ("quoted-phrase-without-separator", 'the password "reset link"', 'the password "reset link"'),
    ("password-possessive", "the password's 'fine'", "the password's 'fine'"),
    ("quoted-field-name", 'the "password" field and "username1"', 'the "password" field and "username1"'),
    # a value quoted straight after the word is still the value (it was passed over as a possessive)
    ("quoted-right-after-cjk-word", '我的密码"abc123"', '我的密码"[REDACTED:password]"'),
    ("single-quoted-right-after-word", "password'hunter22'", "password'[REDACTED:password]'"),
    # words: one hyphen after ":" or two after "is" make a passphrase; a plain word only when assigned
    ("passphrase-assigned", "password: correct-horse", "password: [REDACTED:password]"),
    ("one-hyphen-after-is", "password is correct-horse", "password is correct-horse"),
    ("passphrase-after-is", "password is correct-horse-battery", "password is [REDACTED:password]"),
    ("hyphenated-prose", "password: case-sensitive", "password: case-sensitive"),
    ("word-assigned", "password: hunter", "password: [REDACTED:password]"),
    ("word-after-is", "password is hunter", "password is [REDACTED:password]"),  # one word ending the clause
    ("word-after-is-goes-on", "my password is dragon and more", "my password is dragon and more"),
    ("describing-word-after-is", "my password is incorrect.", "my password is incorrect."),
    ("participle-after-is", "my password was compromised", "my password was compromised"),
    ("adjective-after-is", "the password is ready", "the password is ready"),
    ("verb-after-to", "set the password to expire.", "set the password to expire."),
    ("spaced-after-chinese-describing-words", "密码是 required field", "密码是 required field"),
    (
        "spaced-after-chinese-with-a-describing-word",
        "我的ssh私钥密码是 correct horse battery staple",
        "我的ssh私钥密码是 [REDACTED:password]",
    ),
    ("word-bare", "password hunter", "password hunter"),
    ("bare-with-digit", "password hunter2", "password [REDACTED:password]"),
    ("bare-5-chars", "password hunt2", "password hunt2"),
    ("bare-6-chars", "password hunt12", "password [REDACTED:password]"),
    ("bare-after-chinese-word", "密码 abc1", "密码 [REDACTED:password]"),
    ("bare-after-chinese-word-no-digit", "密码 ab#cd", "密码 ab#cd"),
    ("symbols-assigned", "password: p@ss!", "password: [REDACTED:password]"),
    ("is-now", "password is now hunter22", "password is now [REDACTED:password]"),
    ("changed-to", "changed my password to hunter22", "changed my password to [REDACTED:password]"),
    ("cjk-also-is", "密码也是 hunter22", "密码也是 [REDACTED:password]"),
    ("cjk-changed-to", "密码改成了 hunter22", "密码改成了 [REDACTED:password]"),
    ("for-the-wifi", "password for the wifi is hunter22", "password for the wifi is [REDACTED:password]"),
    ("sentence-full-stop", "password: hunter22.", "password: [REDACTED:password]."),
    ("sentence-colon", "password: hunter22:", "password: [REDACTED:password]:"),
    ("one-time-code", "one-time password: 482913", "one-time password: 482913"),
    ("placeholder", "password: ${DB_PASSWORD}", "password: ${DB_PASSWORD}"),
    ("path", "password: /etc/secret", "password: /etc/secret"),
    ("self-name", "password = password", "password = password"),
    ("a-count", "password 8 characters", "password 8 characters"),
    ("a-call", "password = input()", "password = input()"),
    ("quoted-ending-in-a-bracket", 'password: "Xk9#mQ2("', 'password: "[REDACTED:password]"'),
    # a unit makes the value a count only within the 12 characters after it
    ("unit-11-spaces-after", "password: hunter22" + " " * 11 + "位", "password: hunter22" + " " * 11 + "位"),
    (
        "unit-12-spaces-after",
        "password: hunter22" + " " * 12 + "位",
        "password: [REDACTED:password]" + " " * 12 + "位",
    ),
    # keys and tokens must be assigned and look generated, or follow their word at once and look random; a
    # named service's key needs no separator and only looks generated
    ("token-assigned", "token: Ab3dE5fG7hJ9kL1m", "token: [REDACTED:generic_token]"),
    ("token-quoted", 'token: "Ab3dE5fG7hJ9kL1m"', 'token: "[REDACTED:generic_token]"'),
    ("token-bare", "token Ab3dE5fG7hJ9kL1m", "token [REDACTED:generic_token]"),
    ("token-bare-quoted", "token 'Ab3dE5fG7hJ9kL1m'", "token '[REDACTED:generic_token]'"),
    ("token-bare-10", "token x7Kp2Lm9Qr", "token [REDACTED:generic_token]"),
    ("token-bare-9", "token x7Kp2Lm9Q", "token x7Kp2Lm9Q"),
    ("token-bare-hex", "idempotency token 9f86d081884c7d65", "idempotency token 9f86d081884c7d65"),
    ("cjk-token-bare", "令牌 sk8Hq2LmP0xZ", "令牌 [REDACTED:generic_token]"),
    ("cjk-private-key-bare", "我的私钥Ab3dE5fG7hJ9kL1m", "我的私钥[REDACTED:private_key]"),
    ("token-bare-generated-not-random", "token abcd1234efgh56", "token abcd1234efgh56"),
    ("token-to", "set the token to Ab3dE5fG7hJ9kL1mZZ", "set the token to [REDACTED:generic_token]"),
    # a passphrase ends where the next assignment starts: each value redacted as what it is, the rest kept
    ("password-then-assignment", "password=hunter22 user=bob", "password=[REDACTED:password] user=bob"),
    (
        "password-then-secret",
        "password=hunter22 secret=Xy9zW8vU7tQ",
        "password=[REDACTED:password] secret=[REDACTED:api_key]",
    ),
    ("token-to-words", "send the token to alice2024 today", "send the token to alice2024 today"),
    ("pin-to", "pin to 2024", "pin to 2024"),
    ("api-key-bare", "api key abc123XYZ789qq", "api key [REDACTED:api_key]"),
    ("api-key-is", "api key is Ab3dE5fG7hJ9kL1mXX", "api key is [REDACTED:api_key]"),
    ("secret-made-of-letters", "secret: abcdefghijklmnop", "secret: abcdefghijklmnop"),
    ("secret-generated", "secret: Ab3dE5fG7h", "secret: [REDACTED:api_key]"),
    ("service-key-bare", "OpenAI api key abcd1234efgh56", "OpenAI api key [REDACTED:api_key]"),
    ("service-key-hex", "OpenAI api key abcdef123456", "OpenAI api key abcdef123456"),
    ("service-token", "github token: Ab3dE5fG7hJ9kL1mXX", "github token: [REDACTED:generic_token]"),
    ("service-token-is", "github token is Ab3dE5fG7hJ9kL1mXX", "github token is [REDACTED:generic_token]"),
    ("service-token-bare", "github token Ab3dE5fG7hJ9kL1mXX", "github token [REDACTED:generic_token]"),
    ("service-key", "github key: Ab3dE5fG7hJ9kL1mXX", "github key: [REDACTED:api_key]"),
    ("service-tokens", "github tokens: Ab3dE5fG7hJ9kL1mXX", "github tokens: [REDACTED:generic_token]"),
    (
        "feishu-token-mid-sentence",
        "我的飞书 token: Ab3dE5fG7hJ9kL1m",
        "我的飞书 token: [REDACTED:feishu_secret]",
    ),
    ("service-token-hex", "github token: 9f86d081884c7d65", "github token: [REDACTED:generic_token]"),
    ("service-password-bare-number", "github password 12345678", "github password 12345678"),
    ("service-named-after", "api key abcd1234efgh56 for OpenAI", "api key abcd1234efgh56 for OpenAI"),
    # a service named up to 24 characters before a bare key word
    (
        "service-24-before",
        "OpenAI" + "的" * 18 + "api key abcd1234efgh56",
        "OpenAI" + "的" * 18 + "api key [REDACTED:api_key]",
    ),
    (
        "service-25-before",
        "OpenAI" + "的" * 19 + "api key abcd1234efgh56",
        "OpenAI" + "的" * 19 + "api key abcd1234efgh56",
    ),
    # Feishu named up to 40 characters before a secret makes it a Feishu secret; named after, it does not
    (
        "feishu-40-before",
        "飞书" + "的" * 38 + "secret: Ab3dE5fG7h",
        "飞书" + "的" * 38 + "secret: [REDACTED:feishu_secret]",
    ),
    (
        "feishu-41-before",
        "飞书" + "的" * 39 + "secret: Ab3dE5fG7h",
        "飞书" + "的" * 39 + "secret: [REDACTED:api_key]",
    ),
    ("feishu-named-after", "secret: Ab3dE5fG7h 飞书", "secret: [REDACTED:api_key] 飞书"),
    (
        "feishu-named-secret-hex",
        "飞书 app secret: 9f86d081884c7d65",
        "飞书 app secret: [REDACTED:feishu_secret]",
    ),
    ("feishu-secret-hex", "app secret: 9f86d081884c7d65", "app secret: [REDACTED:feishu_secret]"),
    (
        "service-key-every-hex-digit",
        "OpenAI api key 0123456789abcdef-ABCDEF",
        "OpenAI api key 0123456789abcdef-ABCDEF",
    ),
    ("weak-key-hex", "my_key = 9f86d081884c7d659a2feaa0c55ad015", "my_key = [REDACTED:api_key]"),
    ("weak-key-name", "my_key = Ab3dE5fG7hJ9kL1m", "my_key = [REDACTED:api_key]"),
    ("weak-key-name-letters-run", "my_key = abcdefgh12345678", "my_key = abcdefgh12345678"),
    ("feishu-app-secret", "app secret: Ab3dE5fG7hJ9kL1m", "app secret: [REDACTED:feishu_secret]"),
    ("feishu-named-bare", "飞书 app secret Ab3dE5fG7hJ9kL1m", "飞书 app secret [REDACTED:feishu_secret]"),
    (
        "feishu-near-secret",
        "飞书应用的 secret: Ab3dE5fG7hJ9kL1m",
        "飞书应用的 secret: [REDACTED:feishu_secret]",
    ),
    ("encrypt-key-bare", "encrypt key EK-Ab3dE5fG7hJ9kL1m", "encrypt key [REDACTED:feishu_secret]"),
    (
        "verification-token",
        "verification token: Ab3dE5fG7hJ9kL1m",
        "verification token: [REDACTED:feishu_secret]",
    ),
    ("private-key-word", "private key: Ab3dE5fG7hJ9kL1m", "private key: [REDACTED:private_key]"),
    ("cjk-key", "密钥：Ab3dE5fG7hJ9kL1m", "密钥：[REDACTED:api_key]"),
    ("cjk-token", "令牌：Ab3dE5fG7hJ9kL1m", "令牌：[REDACTED:generic_token]"),
]


@pytest.mark.parametrize(("text", "stored"), [pytest.param(t, r, id=i) for i, t, r in RULES])
def test_each_contextual_rule_at_its_edge(text: str, stored: str) -> None:
    assert redact(text) == stored
    assert contains_secret(text) == (stored != text)


def test_one_pass_finds_every_secret_after_a_chinese_password() -> None:
    # `redact` repeats until nothing is found, which would hide a miss; a long paste is scanned once.
    text = "我的密码是芝麻开门，PIN码: 4821"
    assert [(f.kind, text[f.start : f.end]) for f in find_secrets(text)] == [
        ("password", "芝麻开门"),
        ("pin", "4821"),
    ]
    # a secret word with no value after it does not end the scan either
    assert [f.kind for f in find_secrets("忘了密码？PIN码: 4821")] == ["pin"]
    # nor does a rejected value: the scan goes on inside it ("x/cvv=123" is no PIN, "cvv=123" is), however far in
    assert [f.kind for f in find_secrets("a" * 250 + " pin: x/cvv=123")] == ["pin"]


def test_a_long_paste_is_redacted_window_by_window_as_in_one_pass() -> None:
    # The writer sets a long pasted blob aside with `redact_long`; secrets across a window's edge are
    # found as whole ones, each counted once.
    text = ("x" * 50 + " token=ghp_" + "a1B2c3D4e5" * 4 + " ") * 5
    for window in (64, 100):
        assert redact_long(text, window=window, context=60) == (redact(text), 5)
    assert redact(text).count("[REDACTED:github_token]") == 5
    # a secret at the very start, one starting exactly on a window's edge, and two that touch
    tok = "ghp_" + "a1B2c3D4e5" * 4
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx9Yzx9Yzx9Yz\n-----END RSA PRIVATE KEY-----"
    edges = tok + " " * (64 - len(tok)) + tok + " " * 30 + pem + "AKIAIOSFODNN7EXAMPLQ" + " " * 50
    assert redact_long(edges, window=64, context=60) == (redact(edges), 4)
    assert redact(edges).split() == ["[REDACTED:github_token]"] * 2 + [
        "[REDACTED:private_key][REDACTED:aws_key]"
    ]
    assert redact_long("password: hunter22") == ("password: [REDACTED:password]", 1)
    assert redact_long("no secret here") == ("no secret here", 0)


# --- properties ------------------------------------------------------------------------------------------

# Text built from pieces that make detectors fire, glued with arbitrary Unicode (lone surrogates included).
_PIECES = st.sampled_from(
    [
        "密码是 ",
        "password: ",
        "token=",
        "Authorization: Bearer ",
        "hunter2",
        "Abc12345",
        "ghp_" + "a1B2c3D4e5" * 4,
        "sk-",
        "11010519491231002X",
        "6222 0212 3456 7890 128",
        "4111111111111111",
        "-----BEGIN RSA PRIVATE KEY-----\n",
        "MIIEowIBAAKCAQEAx9Yz",
        "postgres://u:",
        "@",
        "[REDACTED:password]",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.",
        " ",
        "，",
        "\n",
    ]
)
_TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=12).map("".join)


def _check_spans(text: str, found: list[SecretFinding]) -> None:
    last_end = 0
    for f in found:
        assert 0 <= f.start < f.end <= len(text)
        assert f.start >= last_end, "findings overlap or are out of order"
        last_end = f.end


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_unicode_never_crashes(text: str) -> None:
    _check_spans(text, find_secrets(text))


@settings(max_examples=400, deadline=None)
@given(_TEXT)
def test_spans_are_ordered_and_in_bounds(text: str) -> None:
    _check_spans(text, find_secrets(text))


@settings(max_examples=400, deadline=None)
@given(_TEXT)
def test_redact_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once
    assert find_secrets(once) == []


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), _TEXT))
def test_text_without_findings_is_unchanged(text: str) -> None:
    if not find_secrets(text):
        assert redact(text) == text
    else:
        assert redact(text) != text
