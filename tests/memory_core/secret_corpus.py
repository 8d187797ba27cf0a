"""The secret detector's corpus: secrets that must be caught, and look-alikes that must pass.

`POSITIVES` holds realistic messages (Chinese and English) that each carry one secret: the test asserts it is
found, of an expected kind, and that redaction removes exactly the secret and keeps every other character.
`BENIGN` holds ordinary facts that resemble secrets -- password-manager talk, order numbers, phones, hashes,
placeholders -- which the bot must still be able to remember.

Tokens are generated from a fixed seed, and ID and card numbers by the small checksum helpers below, written
independently of the module so that a bug in its checksum code cannot hide itself.
"""

from __future__ import annotations

import base64
import json
import random
import string
from dataclasses import dataclass

_rng = random.Random(20260620)
ALNUM = string.ascii_letters + string.digits
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"


@dataclass(frozen=True)
class Positive:
    id: str
    text: str
    secret: str  # the exact substring that redaction must replace
    kinds: frozenset[str]  # acceptable kinds for the finding that covers it


def token(n: int, alphabet: str = ALNUM) -> str:
    """A random token with letters of both cases and digits (as real generated credentials have)."""
    while True:
        t = "".join(_rng.choice(alphabet) for _ in range(n))
        if not any(c.isdigit() for c in t) or not any(c.isalpha() for c in t):
            continue
        if alphabet != ALNUM or (any(c.islower() for c in t) and any(c.isupper() for c in t)):
            return t


def luhn_check_digit(partial: str) -> str:
    total = 0
    for i, c in enumerate(reversed(partial)):
        d = int(c) * (2 if i % 2 == 0 else 1)
        total += d // 10 + d % 10
    return str((10 - total % 10) % 10)


def card(prefix: str, length: int) -> str:
    """A Luhn-valid card number with this IIN prefix and total length."""
    body = prefix + "".join(_rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
    return body + luhn_check_digit(body)


def luhn_ok(number: str) -> bool:
    digits = [int(c) for c in number if c.isdigit()]
    total = sum(
        d if i % 2 == 0 else (d * 2 - 9 if d * 2 > 9 else d * 2) for i, d in enumerate(reversed(digits))
    )
    return total % 10 == 0


def grouped(number: str, sep: str = " ") -> str:
    return sep.join(number[i : i + 4] for i in range(0, len(number), 4))


ID_WEIGHTS = [2 ** (17 - i) % 11 for i in range(17)]  # ISO 7064 MOD 11-2 weights: 7 9 10 5 8 4 2 1 6 3 …


def cn_id(region: str, birth: str, seq: str) -> str:
    """An 18-character resident ID with a correct ISO 7064 MOD 11-2 check character."""
    body = region + birth + seq
    total = sum(int(c) * w for c, w in zip(body, ID_WEIGHTS, strict=True))
    return body + "10X98765432"[total % 11]


def cn_id_with_x(region: str, birth: str) -> str:
    """A valid ID whose check character is X (the case naive digit-only rules miss)."""
    for n in range(1000):
        candidate = cn_id(region, birth, f"{n:03d}")
        if candidate.endswith("X"):
            return candidate
    raise AssertionError("unreachable: one sequence in eleven ends in X")


def jwt(payload: dict[str, object], alg: str = "HS256") -> str:
    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).rstrip(b"=").decode()

    return f"{part({'alg': alg, 'typ': 'JWT'})}.{part(payload)}.{token(43, B64URL)}"


def pem_body(lines: int) -> str:
    return "\n".join(token(64, B64) for _ in range(lines)) + "\n" + token(24, B64) + "=="


POSITIVES: list[Positive] = []


def add(group: str, kinds: str, secret: str, *templates: str) -> None:
    """One case per template; `{s}` marks where the secret goes."""
    for t in templates:
        n = sum(1 for p in POSITIVES if p.id.startswith(group + "-")) + 1
        POSITIVES.append(
            Positive(f"{group}-{n:02d}", t.replace("{s}", secret), secret, frozenset(kinds.split()))
        )


# --- passwords, Chinese phrasings ------------------------------------------------------------------------
for tpl, pw in [
    ("我的密码是 {s}", "hunter2"),
    ("我的密码是{s}", "Abc@12345"),
    ("邮箱密码：{s}", "qwe123!@#"),
    ("WiFi密码是{s}", "Xy7#pLm2"),
    ("家里的 wifi 密码 {s}，客人来了告诉他们", "88488848"),
    ("公司VPN的密码为 {s}", "P@ssw0rd2024"),
    ("我把密码改成了{s}", "1qaz2wsx"),
    ("服务器 root 口令：{s}", "Tr0ub4dor&3"),
    ("支付密码是 {s}", "820317"),
    ("银行卡密码 {s}", "135790"),
    ("登录密码：「{s}」", "zhangsan520"),
    ("密码是“{s}”，别忘了", "admin123"),
    ("路由器后台密码设置为 {s}", "Tt20240518"),
    ("我的QQ密码是{s}别告诉别人", "Welcome1!"),
    ("数据库密码也是 {s}", "sunShine88"),
    ("门禁密码是 {s}", "4826"),
    ("保险箱密码：{s}。", "mima6677"),
    ("新密码换成 {s} 了", "Lx19930815"),
    ("记一下：堡垒机口令 {s}", "Bastion#2024"),
    ("Gmail 的密码是 {s}", "Zz_2008ok"),
    ("iCloud密码：{s}", "wdmm_0001"),
    ("我老婆的微信密码是 {s}", "lp520lp1314"),
    ("测试环境 mysql 密码 {s}", "test@123"),
    ("记住，密码为：{s}", "Summer2025!"),
    ("家里电脑开机密码是{s}", "0618ab"),
    ("新办的信用卡取款密码 {s}", "902615"),
    ("公司 Wi-Fi 叫 Guest-5G，密码 {s}", "guest8888"),
    ("账号 alice，密码 {s}", "alice@2024"),
    ("用户名 admin 密码 {s}", "Adm1n!234"),
    ("老板说 jenkins 的密码就是 {s}", "jenkins2023"),
    ("密码：'{s}'", "k8s-Dev-09"),
    ("把网银登录密码设成了{s}", "Ww66778899"),
    ("这是我的 Apple ID 密码：{s}", "Apple#id77"),
    ("NAS 管理员口令是 {s}", "nasAdmin_19"),
    ("密码都是 {s}", "passw0rd"),
    ("我的密码是 sunflower", "sunflower"),
    ("密码：{s} 先别改", "hunter"),
    ("我的 wifi 密码是“{s}”", "芝麻 开门"),
    ("保险柜密码是「{s}」", "芝麻开门"),
]:
    add("zh-password", "password", pw, tpl)

# --- passwords, English phrasings ------------------------------------------------------------------------
for tpl, pw in [
    ("my password is {s}", "hunter2"),
    ("Password: {s}", "S3cure!Pass"),
    ("the wifi password is {s}", "Sunset#42"),
    ("password for the router is {s}", "x7Kq!9zz"),
    ("I changed my password to {s}", "N3wYear2026"),
    ("pwd: {s}", "letmein99"),
    ("passphrase = {s}", "Blue&Green7"),
    ("login alice / password {s}", "Rk9vT2xp"),
    ("my gmail password is {s}, don't share it", "gm@il2024"),
    ("Remember: password = {s}", "Qwerty!23"),
    ("The password to the VPN is {s}.", "vpnAccess77"),
    ("password was {s} until yesterday", "OldPass#1"),
    ("my new password is now {s}", "Fresh2026$"),
    ('use password "{s}" to log in', "dragon-8812"),
    ("Netflix password: {s}", "netflixAndChill5"),
    ("passcode: {s}", "739204"),
    ("the admin passwd is {s}", "r00tme!"),
    ("Here's my password: {s}", "MyDog$Rex3"),
    ("password of my work laptop is {s}", "L4ptop@Work"),
    ("wifi pass phrase: {s}", "coffee2go!"),
    ("My bank password is {s}", "B4nk!ng2025"),
    ("password: '{s}'", "single_q1"),
    ("set the db password to {s}", "dbPass_2024"),
    ("root password => {s}", "t0ps3cret"),
    ("Password = {s}", "eq-sign-42"),
    ("password is: {s}", "c0lon!after"),
    ("Wi-Fi password {s}", "Home2G4G5"),
    ("Password for alice@example.com is {s}", "Alic3Mail!"),
    ("temporary password: {s} (change it after login)", "Tmp-93jd2"),
    ("the door passcode is {s}", "4471"),
    ("My password is {s}", "correcthorse7"),
    ('password is "{s}"', "open sesame 42"),
    ("Wi-Fi: MyHome, pass: {s}", "58219034"),  # not "12345678": benign phone and order numbers contain that
    ("password: {s}", "P@ss&Word9"),
]:
    add("en-password", "password", pw, tpl)

# --- PINs and card security codes ------------------------------------------------------------------------
for tpl, pin in [
    ("my pin is {s}", "4821"),
    ("PIN: {s}", "902731"),
    ("PIN码是 {s}", "5078"),
    ("the card pin is {s}", "0417"),
    ("ATM pin = {s}", "6650"),
    ("CVV: {s}", "318"),
    ("安全码是 {s}", "442"),
    ("my phone's pin code is {s}", "192837"),
    ("pin number: {s}", "55128"),
    ("SIM卡 PIN 码：{s}", "8392"),
]:
    add("pin", "pin", pin, tpl)

# --- configuration lines and env files -------------------------------------------------------------------
_cfg = [
    ("DB_PASSWORD={s}", token(16), "password"),
    ("export MYSQL_ROOT_PASSWORD='{s}'", token(20), "password"),
    ('REDIS_PASSWORD="{s}"', token(24), "password"),
    ("JWT_SECRET={s}", token(32), "api_key"),
    ("SECRET_KEY = '{s}'", "django-insecure-" + token(40), "api_key"),
    ("API_KEY={s}", token(32), "api_key"),
    ("apiKey: '{s}'", token(28), "api_key"),
    ('{"username": "bob", "password": "{s}"}', token(14), "password"),
    ("client_secret: {s}", token(40), "api_key"),
    ('app_secret = "{s}"', token(32), "feishu_secret"),
    ("encrypt_key: {s}", token(32), "feishu_secret"),
    ("verification_token = {s}", token(32), "feishu_secret"),
    ("aws_secret_access_key = {s}", token(40, B64), "aws_key"),
    ("ACCESS_TOKEN={s}", token(36), "generic_token"),
    ("refresh_token: {s}", token(48), "generic_token"),
    ("LUCID_ADMIN_TOKEN={s}", token(32), "generic_token"),
    ("LUCID_VAULT_KEY={s}", token(43, B64URL) + "=", "api_key"),
    ("spring.datasource.password={s}", token(18), "password"),
    ("Server=db;Database=app;User Id=sa;Password={s};", token(15), "password"),
    ("STRIPE_WEBHOOK_SECRET={s}", token(30), "api_key"),
    ("slack_signing_secret: {s}", "".join(_rng.choice("0123456789abcdef") for _ in range(32)), "api_key"),
    ("bot_token: {s}", token(40), "generic_token"),
    ("db.pass = {s}", token(12), "password"),
    ("    POSTGRES_PASSWORD: {s}", token(22), "password"),
    ("auth_token={s}", token(32), "generic_token"),
    ("githubToken: {s}", token(40), "generic_token"),
    ("private_key: {s}", "".join(_rng.choice("0123456789abcdef") for _ in range(64)), "private_key"),
    ("CLIENT_SECRET := {s}", token(24), "api_key"),
    ("https://api.example.com/callback?access_token={s}&state=af0ifjsldkj", token(30), "generic_token"),
]
for tpl, value, kind in _cfg:
    add("config", kind, value, tpl)

# --- keys and tokens named in a sentence -----------------------------------------------------------------
for tpl, kind in [
    ("我的 API key 是 {s}", "api_key"),
    ("密钥：{s}", "api_key"),
    ("飞书应用的 App Secret 是 {s}", "feishu_secret"),
    ("App Secret: {s}", "feishu_secret"),
    ("令牌是 {s}", "generic_token"),
    ("access token: {s}", "generic_token"),
    ("client secret = {s}", "api_key"),
    ("secret key 为 {s}", "api_key"),
    ("refresh token: {s}", "generic_token"),
    ("verification token 是 {s}", "feishu_secret"),
    ("Encrypt Key：{s}", "feishu_secret"),
    ("飞书机器人的密钥是 {s}", "feishu_secret"),
    ("the api key is {s}", "api_key"),
    ("secret: {s}", "api_key"),
    ("访问令牌为 {s}", "generic_token"),
    ("秘钥 = {s}", "api_key"),
    ("API-Key: {s}", "api_key"),
    ("signing secret: {s}", "api_key"),
    ("我的 token 是 {s}", "generic_token"),
    ("测试环境的 secret key：{s}", "api_key"),
]:
    add("phrase", kind, token(32), tpl)
add("phrase", "private_key", "".join(_rng.choice("0123456789abcdef") for _ in range(64)), "私钥是 {s}")
add("phrase", "aws_key", token(40, B64), "AWS secret access key: {s}")

# --- fixed token formats ---------------------------------------------------------------------------------
AWS32 = string.ascii_uppercase + "234567"


def aws_id(prefix: str) -> str:
    return prefix + token(16, AWS32)


add("aws", "aws_key", aws_id("AKIA"), "aws access key id {s}")
add("aws", "aws_key", aws_id("AKIA"), "我的 AWS key 是 {s}")
add("aws", "aws_key", aws_id("AKIA"), "aws_access_key_id = {s}")
add("aws", "aws_key", aws_id("ASIA"), "临时凭证 {s}，一小时后过期")
add("aws", "aws_key", aws_id("AKIA"), "{s}")
add("aws", "aws_key", aws_id("AKIA"), "IAM user ci-deployer uses {s} for uploads")
add("aws", "aws_key", token(40, B64), "AWS_SECRET_ACCESS_KEY={s}")
add("aws", "aws_key", "AKIAIOSFODNN7EXAMPLE", "the docs key {s} still counts as a key")

add("github", "github_token", "ghp_" + token(36), "my github token is {s}")
add("github", "github_token", "ghp_" + token(36), "git clone https://{s}@github.com/acme/infra.git")
add("github", "github_token", "gho_" + token(36), "GH_TOKEN={s}")
add("github", "github_token", "ghs_" + token(36), "CI 里用的是 {s}")
add("github", "github_token", "ghu_" + token(36), "user-to-server token {s}")
add("github", "github_token", "ghr_" + token(36), "refresh with {s} tomorrow")
add("github", "github_token", "github_pat_" + token(22) + "_" + token(59), "fine-grained PAT: {s}")
add("github", "github_token", "ghp_" + token(36), "记住 GitHub 的 token：{s}")

add("gitlab", "gitlab_token", "glpat-" + token(20), "gitlab token {s}")
add("gitlab", "gitlab_token", "glpat-" + token(20), "git clone https://oauth2:{s}@gitlab.example.com/g/p.git")
add("gitlab", "gitlab_token", "glpat-" + token(20), "把 {s} 配到 CI 变量里")

add("slack", "slack_token", f"xoxb-{_rng.randrange(10**11, 10**12)}-{_rng.randrange(10**12, 10**13)}-{token(24)}",
    "slack bot token {s}")  # fmt: skip
add("slack", "slack_token", f"xoxp-{_rng.randrange(10**11, 10**12)}-{_rng.randrange(10**11, 10**12)}-{token(32)}",
    "我的 Slack 用户 token 是 {s}")  # fmt: skip
add("slack", "slack_token", f"xoxa-2-{_rng.randrange(10**11, 10**12)}-{token(30)}", "legacy app token {s}")
add("slack", "slack_token", f"xoxr-{_rng.randrange(10**11, 10**12)}-{token(40)}", "refresh: {s}")
add("slack", "slack_token", f"https://hooks.slack.com/services/T{token(8, AWS32)}/B{token(10, AWS32)}/{token(24)}",
    "post alerts to {s} please")  # fmt: skip
add("slack", "slack_token", f"xoxb-{_rng.randrange(10**11, 10**12)}-{_rng.randrange(10**12, 10**13)}-{token(24)}",
    "{s}")  # fmt: skip

add("stripe", "stripe_key", "sk_live_" + token(24), "stripe live key {s}")
add("stripe", "stripe_key", "rk_live_" + token(24), "restricted key: {s}")
add("stripe", "stripe_key", "sk_test_" + token(24), "测试用的 Stripe 密钥 {s}")
add("stripe", "stripe_key", "whsec_" + token(32), "webhook signing: {s}")
add("stripe", "stripe_key", "sk_live_" + token(99), "STRIPE_KEY={s}")

add("openai", "openai_key", "sk-" + token(48), "openai key {s}")
add("openai", "openai_key", "sk-proj-" + token(64, B64URL), "export OPENAI_API_KEY={s}")
add("openai", "openai_key", "sk-" + "".join(_rng.choice("0123456789abcdef") for _ in range(32)),
    "DeepSeek 的 key 是 {s}")  # fmt: skip
add("openai", "openai_key", "sk-proj-" + token(64, B64URL), "用这个 {s} 调接口")
add("openai", "openai_key", "sk-" + token(48), "openai.api_key = '{s}'")
add("openai", "openai_key", "sk-svcacct-" + token(48, B64URL), "service account {s}")

add("anthropic", "anthropic_key", "sk-ant-api03-" + token(93, B64URL) + "AA", "anthropic key {s}")
add("anthropic", "anthropic_key", "sk-ant-api03-" + token(93, B64URL) + "AA", "ANTHROPIC_API_KEY={s}")
add("anthropic", "anthropic_key", "sk-ant-admin01-" + token(93, B64URL) + "AA", "Claude 的管理员 key：{s}")

add("google", "google_api_key", "AIza" + token(35, B64URL), "maps key {s}")
add("google", "google_api_key", "AIza" + token(35, B64URL), "GOOGLE_API_KEY={s}")
add("google", "google_api_key", "AIza" + token(35, B64URL), "Gemini 用的 {s}")
add(
    "google",
    "google_api_key",
    "AIza" + token(35, B64URL),
    "<script src='https://maps.googleapis.com/maps/api/js?key={s}'>",
)

add("jwt", "jwt", jwt({"sub": "1234567890", "name": "Alice", "iat": 1718870400}), "session jwt {s}")
add("jwt", "jwt", jwt({"uid": 42, "exp": 1750000000}, "RS256"), "登录后拿到的 token：{s}")
add("jwt", "jwt", jwt({"scope": "admin"}), "cookie auth={s}; Path=/")
add("jwt", "jwt", jwt({"sub": "ou_abc", "tenant": "t1"}, "ES256"), "{s}")
add("jwt", "jwt bearer_token", jwt({"sub": "svc"}), "Authorization: Bearer {s}")
add("jwt", "jwt", jwt({"role": "service_role", "iss": "supabase"}), "supabase service key {s}")
add("jwt", "jwt", jwt({"sub": "42"}, "none")[:-43], "unsigned: {s}")
add("jwt", "jwt", jwt({"email": "bob@example.com", "exp": 1893456000}), "id_token={s}")

add("feishu", "feishu_token", "t-g1044" + token(36), "tenant_access_token 是 {s}")
add("feishu", "feishu_token", "u-" + token(40), "user token {s}")
add("feishu", "feishu_token", "https://open.feishu.cn/open-apis/bot/v2/hook/"
    + "-".join(token(n, "0123456789abcdef") for n in (8, 4, 4, 4, 12)), "群机器人 webhook：{s}")  # fmt: skip
add(
    "feishu", "feishu_token", "t-" + token(40), "curl -H 'Authorization: Bearer {s}' https://open.feishu.cn/x"
)

add("misc", "api_key", "hf_" + token(34), "huggingface token {s}")
add("misc", "api_key", "npm_" + token(36), "//registry.npmjs.org/:_authToken={s}")
add("misc", "api_key", "SG." + token(22, B64URL) + "." + token(43, B64URL), "sendgrid {s}")
add("misc", "api_key", "pypi-AgEIcHlwaS5vcmc" + token(60, B64URL), "twine password {s}")

# --- Authorization headers -------------------------------------------------------------------------------
add("auth", "bearer_token", token(40), "Authorization: Bearer {s}")
add(
    "auth",
    "bearer_token",
    token(40, B64URL),
    "curl -H 'Authorization: Bearer {s}' https://api.example.com/v1/me",
)
add("auth", "password", base64.b64encode(b"alice:wonderland9").decode(), "Authorization: Basic {s}")
add("auth", "bearer_token", token(32), "authorization: token {s}")
add("auth", "bearer_token", token(48, B64URL), "send it with Bearer {s} in the header")
add("auth", "bearer_token", token(36), '"Authorization": "Bearer {s}"')

# --- URLs with credentials -------------------------------------------------------------------------------
for tpl, pw in [
    ("postgres://admin:{s}@db.internal:5432/app", token(16)),
    ("mysql://root:{s}@127.0.0.1:3306/test", "root1234"),
    ("redis://:{s}@cache:6379/0", token(20)),
    ("mongodb+srv://appuser:{s}@cluster0.abcde.mongodb.net/?retryWrites=true", token(18)),
    ("git remote add origin https://alice:{s}@git.example.com/repo.git", "hunter2!"),
    ("amqp://guest:{s}@rabbit:5672//", "guest-Pw9"),
    ("ftp://user:{s}@ftp.example.com/pub", "ftpPass88"),
    ("DATABASE_URL=postgresql://app:{s}@localhost/app", token(24)),
    ("连接串是 mysql+pymysql://lucid:{s}@10.0.0.5/lucid", "LuCid#2026"),
]:
    add("url", "connection_string", pw, tpl)

# --- PEM private keys ------------------------------------------------------------------------------------
for label in ("RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY", "PRIVATE KEY", "ENCRYPTED PRIVATE KEY",
              "DSA PRIVATE KEY", "PGP PRIVATE KEY BLOCK"):  # fmt: skip
    block = f"-----BEGIN {label}-----\n{pem_body(6)}\n-----END {label}-----"
    add("pem", "private_key", block, "这是服务器的私钥：\n{s}\n用完删掉", "key:\n{s}")
add("pem", "private_key", "-----BEGIN RSA PRIVATE KEY-----\n" + pem_body(5), "truncated paste:\n{s}\n\n谢谢")
add("pem", "private_key", "-----BEGIN PRIVATE KEY-----\n" + pem_body(3), "{s}")
add("pem", "private_key", "-----BEGIN RSA PRIVATE KEY----- " + " ".join(token(64, B64) for _ in range(4))
    + " -----END RSA PRIVATE KEY-----", "one line: {s} ok")  # fmt: skip
add("pem", "private_key", "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"
    "DEK-Info: AES-128-CBC,3F17F5316E2BAC89\n\n" + pem_body(4) + "\n-----END RSA PRIVATE KEY-----",
    "encrypted one:\n{s}")  # fmt: skip

# --- Chinese resident ID numbers -------------------------------------------------------------------------
_ids = [
    cn_id("110105", "19900307", "123"),
    cn_id("310104", "19850621", "456"),
    cn_id("440305", "20011130", "078"),
    cn_id("330106", "19720229", "331"),  # a leap day
    cn_id("510107", "19991231", "902"),
    cn_id_with_x("420106", "19880808"),
    cn_id_with_x("320102", "19650115"),
    cn_id("370202", "20100501", "015"),
    cn_id("610113", "19930917", "627"),
    cn_id("500103", "19801009", "244"),
    cn_id("650102", "19571201", "119"),
    cn_id("130102", "20200202", "680"),
]
for tpl, ident in zip(
    [
        "我的身份证号是{s}",
        "身份证：{s}",
        "ID number: {s}",
        "身份证号码 {s}，出生在深圳",
        "帮我记住老婆的身份证 {s}",
        "证件号{s}",
        "Chinese ID {s} (mine)",
        "孩子的身份证号：{s}",
        "报名表上填的是 {s}",
        "身份证号 {s} 用于实名认证",
        "my dad's id is {s}",
        "{s}",
    ],
    _ids,
    strict=True,
):
    add("cn-id", "cn_id_number", ident, tpl)
add("cn-id", "cn_id_number", _ids[5].lower(), "身份证（小写 x）{s}")

# --- bank cards ------------------------------------------------------------------------------------------
_cards = [
    ("卡号 {s}", card("622202", 19)),
    ("我的银行卡号是{s}", card("621700", 19)),
    ("招商银行卡 {s}", grouped(card("622588", 16))),
    ("card number: {s}", grouped(card("4", 16))),
    ("Visa {s} exp 12/28", card("4", 16)),
    ("信用卡 {s} 的账单日是 5 号", grouped(card("5", 16), "-")),
    ("Mastercard {s}", card("53", 16)),
    ("amex {s}", (lambda n: f"{n[:4]} {n[4:10]} {n[10:]}")(card("37", 15))),
    ("JCB card {s}", card("35", 16)),
    ("Discover {s}", card("6011", 16)),
    ("转账到 {s}", card("622848", 19)),
    ("please pay to {s}", card("4", 16)),
    ("工资卡：{s}", grouped(card("621226", 19))),
    ("借记卡 {s} 已挂失", card("623058", 19)),
    ("new card {s}", card("2221", 16)),
    ("储蓄卡号 {s}", grouped(card("622700", 16), "-")),
    ("卡号是 {s}，户名张三", grouped(card("622202", 19))),
    ("old visa {s}", card("4", 13)),
    ("银联卡 {s}", card("625", 17)),
    ("{s}", card("4", 16)),
    ("Diners Club {s}", card("36", 14)),
    ("备用卡 {s}", grouped(card("4", 16))),
]
for tpl, number in _cards:
    add("card", "bank_card", number, tpl)

# --- unlabelled high-entropy strings next to a secret word ----------------------------------------------
for tpl in [
    "这个令牌 {s} 明天过期",
    "{s} 是我的密钥",
    "the secret {s} for staging",
    "帮我记一下 token {s}",
    "key {s} is for the backup bucket",
    "凭证 {s}",
    "credentials {s} for the staging bucket",
    "我的 API key {s}，别外传",
    "the new api key {s}",
    "这是 webhook 的 secret {s}",
]:
    add("generic", "generic_token api_key", token(32, B64URL), tpl)  # a key word right before: its kind


# --- issue 15: the whole class of words for a secret ------------------------------------------------------
# The word list comes from scanner rule sets, not from the issue's examples: detect-secrets' KeywordDetector
# denylist (password, passwd, pwd, secret, *_key, *_pass, contraseña), gitleaks' generic-api-key keywords
# (access, auth, api, credential, creds, key, passw, secret, token) and its per-service rules, trufflehog's
# detector keywords (service name + key/token/secret), and a survey of how people write secrets in Chinese
# chat (口令, 暗号, 暗码, 密语, 提取码, 授权码, 解锁码, 门禁码; 支付密码, 银行密码; 密钥/秘钥).
for tpl, pw in [
    ("我的密码是{s}", "芝麻开门"),  # a value in Chinese characters, no separator space
    ("我的银行密码是{s}", "芝麻开门"),
    ("支付密码：{s}", "天王盖地虎"),
    ("接头暗号是{s}", "宝塔镇河妖"),
    ("暗码为{s}，记住", "月落乌啼"),
    ("保险箱的开锁码是 {s}", "东南西北"),
    ("口令：{s}", "春江花月夜"),
    ("我的微信支付密码是{s}。", "三三二一"),
    ("家里门禁码是{s}", "8899#"),
    ("百度网盘提取码：{s}", "a8k2"),
    ("QQ邮箱的授权码是 {s}", "abcdefghijklmnop"),
    ("手机解锁码 {s}", "270419"),
    ("密语是{s}", "山高月小水落石出"),
    ("我的密码是 {s}", "abc def ghi"),  # spaced words after a Chinese separator
    ("口令是 {s}", "open sesame now"),
    ("网银密码为 {s}", "river 42 stone"),
    ("WiFi 密码：{s}", "blue sky 2024"),
    ("密码是：{s}", "芝麻 开门"),
    ("我的密码是{s}", "芝麻开门123"),
    ("我的密码是{s}别告诉别人", "芝麻开门"),  # the sentence goes on after the value
    ("银行卡密码是{s}千万别外传", "开心果子"),
    ("门禁口令是{s}记得别忘了", "山海关"),
]:
    add("zh-kin", "password", pw, tpl)

for tpl, pw in [
    ("password: {s}", "correct-horse-battery"),  # hyphenated words: a passphrase, not prose
    ("passphrase is {s}", "correct-horse-battery-staple"),
    ("wifi pw is {s}", "sunny2024"),
    ("pw: {s}", "Kx9-mmq2"),
    ("the door code is {s}", "4471#"),
    ("master password: {s}", "vault-Key-88"),
    ("app password = {s}", "xkcd2024app"),
    ("alarm code: {s}", "902213"),
    ("pass key: {s}", "pk-77ab-q1"),
    ("mot de passe : {s}", "Soleil2025"),
    ("Passwort: {s}", "Sommer2025!"),
    ("contraseña: {s}", "Verano2025"),
]:
    add("en-kin", "password", pw, tpl)

# Unquoted spaced English passwords after an English word (issue 15, the "Known gaps" of secretscan).
for tpl, pw in [
    ("my password is {s}", "abc def"),
    ("the wifi password is {s}", "correct horse battery staple"),
    ("The password for the wifi is {s}.", "purple monkey dishwasher"),
    ("I changed my password to {s}", "blue moon 42"),
    ("password: {s}", "seven green apples"),
    ("my bank password was {s}, don't tell anyone", "summer rain 1999"),
    ("Wifi passphrase is {s}", "Tiger Lily Jump"),
    ("the door code is {s}", "4471 open"),
]:
    add("en-spaced", "password", pw, tpl)

# A named service's key, token or secret written with no separator at all.
for tpl, value, kind in [
    ("Feishu encrypt key {s}", "EK-" + token(24), "feishu_secret"),
    ("飞书 app secret {s}", token(32), "feishu_secret"),
    ("lark verification token {s}", token(32), "feishu_secret"),
    ("DeepSeek api key {s}", token(32), "api_key"),
    ("Azure key {s}", token(32), "api_key"),
    ("钉钉 secret {s}", "SEC" + token(40), "api_key"),
    ("GitHub token {s}", token(36), "generic_token"),
    ("Notion token {s}", "secret_" + token(43), "generic_token"),
    ("阿里云 AccessKey Secret {s}", token(30), "api_key"),
    ("OpenAI key: {s}", token(40), "api_key"),
]:
    add("service", kind, value, tpl)


# Written so that the patterns would not see them as they are: traditional characters, full-width or
# styled letters, a zero-width space inside the word or the value; and the password words of other
# languages with their own "is".
for tpl, pw in [
    ("我的密碼是 {s}", "Xk9mQ2vL7p"),
    ("門禁密碼：{s}", "4826#"),
    ("伺服器的金鑰是 {s}", "Tt20240518"),
    ("ｍｙ ｐａｓｓｗｏｒｄ ｉｓ {s}", "ｈｕｎｔｅｒ２２９"),
    ("password：{s}", "ｈｕｎｔｅｒ２２９"),
    ("my pass\u200bword is {s}", "Tr0ub4dor&3"),
    ("我的密\u200b码是 {s}", "Abc12345"),
    ("我的密码是 {s}，别告诉别人", "Ab\u200bc12345"),
    ("𝐩𝐚𝐬𝐬𝐰𝐨𝐫𝐝: {s}", "Xk9mQ2vL7p"),
    ("Mein Passwort ist {s}", "Sonnen2024blume"),
    ("Das Passwort für das WLAN ist {s}", "Kx9mQ2vL7p"),
    ("mi contraseña es {s}", "perro1234"),
    ("La contraseña del wifi es {s}", "Gato2024!"),
    ("mon mot de passe est {s}", "Soleil2024"),
    ("a minha senha é {s}", "Lua123456"),
]:
    add("folded", "password api_key", pw, tpl)


# --- benign look-alikes: each must produce no finding at all ---------------------------------------------
ORDER_NUMBER = "2024051812345678"  # fails Luhn (asserted by a test), and order numbers are not cards anyway

BENIGN: list[tuple[str, str]] = [
    ("password-question-goes-on", "密码是多少别告诉别人"),  # the sentence goes on, but it asks
    ("password-hint-goes-on", "密码是我家狗的名字千万别忘"),
    ("password-manager-1password", "我用 1Password 管理密码"),
    ("password-manager-zh", "密码管理器很好用"),
    ("forgot-password", "忘记密码了怎么办"),
    ("password-reset-expired", "password reset link expired"),
    ("order-number", f"my order number is {ORDER_NUMBER}"),
    ("phone", "call me at 13812345678"),
    ("phone-intl", "我的手机 +86 138 1234 5678"),
    ("phone-dashes", "office 0571-8888-6666"),
    ("uuid", "request id 550e8400-e29b-41d4-a716-446655440000 failed"),
    ("uuid-near-token", "idempotency token 550e8400-e29b-41d4-a716-446655440000"),
    ("git-hash", "fixed in commit 9fceb02d0ae598e95dc970b74767f19372d61af8"),
    ("git-hash-short", "see 9fceb02 for the key change"),
    ("sha256", "sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    ("token-economy", "the token economy"),
    ("sk-learn", "I use sk-learn for clustering"),
    ("scikit-learn", "pip install scikit-learn"),
    ("key-point", "key point: ship on Friday"),
    ("api-key-rotation", "API key rotation policy"),
    ("timestamp", "timestamp 20260620091200"),
    ("timestamp-ms", "时间戳 1718870400000"),
    ("amount", "报销金额 ¥1,299,000.00"),
    ("amount-usd", "the invoice total is $12,345,678.90"),
    ("date", "2024-05-18 10:00 见面"),
    ("isbn-dashes", "ISBN 978-7-111-21382-6"),
    ("isbn-plain", "这本书的 ISBN 是 9787111213826"),
    ("cryptography", "密码学很有意思"),
    ("forgot-wifi", "我忘了 Wi-Fi 密码"),
    ("password-min-length", "password must be at least 8 characters"),
    ("password-required", "Password: required"),
    ("password-incorrect", "your password is incorrect"),
    ("password-length-zh", "密码长度至少 8 位"),
    ("password-range-zh", "密码 8 到 16 位"),
    ("password-chars", "password: 8-16 characters"),
    ("token-count", "token count: 1500"),
    ("max-tokens", "max_tokens=4096"),
    ("token-limit-env", "TOKEN_LIMIT=4096"),
    ("pwd-path", "pwd: /home/alice"),
    ("pwd-command", "pwd 命令显示当前目录"),
    ("bearer-placeholder", "Authorization: Bearer <token>"),
    ("bearer-env", "Authorization: Bearer $TOKEN"),
    ("bearer-rfc", "Bearer authentication is described in RFC 6750"),
    ("url-no-password", "postgres://user@localhost/db"),
    ("url-placeholder", "postgres://user:password@localhost/db"),
    ("url-env-password", "redis://:${REDIS_PASSWORD}@redis:6379"),
    ("env-reference", "DB_PASSWORD=${DB_PASSWORD}"),
    ("env-placeholder", "API_KEY=your_api_key_here"),
    ("masked", "password: ********"),
    ("feishu-app-id", "app_id: cli_a5f3b2c1d0e9f8a7"),
    ("feishu-open-id", "用户 open_id 是 ou_7d8a6e6df7621556ce0d21922b676706ccs"),
    (
        "ssh-public-key",
        "我的公钥是 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    ),
    ("stripe-publishable", "publishable key pk_live_51H8xYzAbCdEfGhIjKlMnOpQr"),
    ("otp-zh", "验证码 123456"),
    ("otp-en", "your verification code is 482913"),
    ("otp-dynamic", "动态密码 771204，五分钟内有效"),
    ("otp-one-time", "one-time password: 551902"),
    ("wrong-id-checksum", "身份证号 110105199003071235"),
    ("id-bad-date", "编号 110105199013451234"),
    ("card-bad-luhn", "卡号 6222021234567890124"),
    ("qq-number", "QQ号 123456789"),
    ("parcel", "快递单号 SF1234567890123"),
    ("ups-tracking", "tracking 1Z999AA10123456784"),
    ("version", "版本号 v1.2.3"),
    ("ip", "服务器 IP 192.168.1.1"),
    ("secret-to-success", "the secret to success is patience"),
    ("secret-sauce", "secret sauce recipe from grandma"),
    ("kms", "密钥管理服务 KMS 很贵"),
    ("private-key-advice", "私钥一定不要泄露"),
    ("pin-drawer", "my pin is in the drawer"),
    ("pin-message", "pin this message to the top"),
    ("pin-forgot", "PIN 码忘了"),
    ("pin-roadmap", "pin to 2024 roadmap"),
    ("lastpass", "we moved from LastPass to Bitwarden"),
    ("password123-talk", "password123 is a terrible password"),
    ("token-expired", "the token expired yesterday"),
    ("jwt-talk", "JWT 是一种令牌格式"),
    ("jwt-prefix-talk", "eyJhbGciOi is what a JWT header looks like"),
    ("token-bucket-zh", "令牌桶算法用来限流"),
    ("token-bucket", "token bucket rate limiter"),
    ("invoice-number", "发票号码 04401900011112345678"),
    ("birthday", "我的生日是 1990-03-07"),
    ("staff-id", "工号 20190815"),
    ("student-id", "学号 2019210345"),
    ("api-key-header", "The API key goes in the X-Api-Key header"),
    ("vault", "store the secret in Vault"),
    ("camel-case", "call getAccessTokenForUser2 to refresh the token"),
    ("slug", "my-secret-token-name-2024 is the name of the k8s secret"),
    ("key-value", "key: value pairs are stored in Redis"),
    ("sort-key", "sort key: created_at"),
    ("cache-key", "cache_key: user:123:profile"),
    ("aws-prefix-talk", "AKIA is the prefix of AWS access key ids"),
    ("ghp-prefix-talk", "ghp_ prefix means personal access token"),
    ("xoxb-talk", "xoxb- tokens are bot tokens"),
    ("sk-ant-talk", "sk-ant- keys are Anthropic's"),
    ("card-last-four", "我的银行卡尾号 1234"),
    ("card-ending", "card ending in 4242"),
    ("pem-header-only", "the file starts with -----BEGIN RSA PRIVATE KEY----- as usual"),
    (
        "public-key-pem",
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----",
    ),
    ("password-is-case-sensitive", "Password is case-sensitive"),
    ("password-policy-ident", "password_policy: strict"),
    ("token-expiry-ident", "token_expiry: 2024-05-18T10:00"),
    ("secretary", "secretary: Alice Wang"),
    ("secret-flag", "is_secret=False"),
    ("password-hint", "密码提示是我家狗的名字"),
    ("password-what", "密码是多少来着"),
    ("wifi-name", "WiFi 名字是 CMCC-5G"),
    ("github-url", "repo at https://github.com/acme/infra"),
    ("email", "email me at alice.wang@example.com"),
    ("s3-path", "s3://lucid-backups/2026/06/20/archive.tar.gz"),
    ("docker-digest", "image sha256:4bcff63911fcb4448bd4fdacec207030997caf25e9bea4045fa6c8c44de311d1"),
    ("order-long", "订单号 4000123412341234 已发货"),
    ("base64-image-talk", "the logo is data:image/png;base64,iVBORw0KGgo="),
    ("wifi-password-question", "what's the wifi password?"),
    ("password-changed", "I changed my password yesterday"),
    ("password-same", "my password is the same as before"),
    ("t-shirt", "t-shirt size L, 3 pieces"),
    # prose and quotes around the word "password"
    ("quoted-phrase-no-separator", 'the password "reset link" expired'),
    ("quoted-word-no-separator", 'password "hint" field'),
    ("quoted-stopword", 'password: "Required"'),
    ("possessive-quote", "the password's strength isn't great"),
    ("pass-prose", "Pass = every want id present"),
    ("pass-word-value", "pass: approved"),
    ("passcode-invite", "The passcode is in the calendar invite"),
    ("passcode-see", "Zoom passcode: see invite"),
    ("lockout-zh", "密码错误次数过多，账户锁定 30 分钟"),
    ("otp-length-zh", "客服说验证码 6 位"),
    # code: the value is an expression, not a secret
    ("code-input", "password = input('Password: ')"),
    ("code-getpass", "password = getpass.getpass()"),
    ("code-form", "pwd = request.form['password']"),
    ("code-self", "self.password = password"),
    ("code-environ", 'token = os.environ["GITHUB_TOKEN"]'),
    ("code-settings", "api_key = settings.OPENAI_API_KEY"),
    ("code-compare", "if password == confirm_password:"),
    ("code-docker-env", "docker run -e POSTGRES_PASSWORD -p 5432:5432 postgres"),
    ("code-subshell", "Use `export TOKEN=$(cat token.txt)` in CI"),
    # identifiers and fields around tokens that are not themselves secret
    ("tenant-key", '"tenant_key": "736588c9260f175e"'),
    ("api-path", "GET /open-apis/bot/v3/info with the tenant token"),
    ("auth-path", "tenant token `…/auth-v3/auth/tenant_access_token_internal`"),
    ("token-type", "token_type: bearer"),
    ("expires-in", "expires_in: 7200"),
    ("client-id", "client_id: 1234567890abcdef"),
    ("aws-account-id", "Our AWS account id is 123456789012"),
    # numbers that are not cards
    ("visa-ending", "I paid with Visa ending 4242 yesterday"),
    ("order-luhn-valid", "order #4111111111111111 shipped"),
    ("card-last-four-zh", "卡号后四位 0128"),
    ("member-card", "我的会员卡号是 88001234"),
    ("meeting-id", "明天 10:30 在 3 号会议室开会，会议号 823 4567 8901"),
    ("code-name", "Project code name: BlueFalcon7"),
    # issue 15: look-alikes of the new words and values
    ("forgot-password-how", "我忘了密码怎么办"),
    ("password-what-zh", "密码是什么"),
    ("password-hint-dog", "我的密码是我家狗的名字"),
    ("password-recipe", "密码是公司名加生日"),
    ("password-length-cjk", "密码是八位数"),
    ("password-same-zh", "新密码和旧密码是一样的"),
    ("payment-password-rule", "支付密码要六位数字"),
    ("bank-password-forgot", "银行密码忘了，明天去柜台"),
    ("red-packet", "口令红包怎么玩"),
    ("red-packet-topic", "群里发了个口令红包，大家抢得很开心"),
    ("passphrase-topic", "暗号对上了，我们接上头了"),
    ("extract-code-where", "提取码在哪里看"),
    ("auth-code-expired", "授权码过期了"),
    ("key-rotation-aws", "AWS key rotation is due next week"),
    ("openai-key-how", "OpenAI key 怎么申请"),
    ("feishu-key-where", "Feishu encrypt key 在后台哪里设置"),
    ("github-token-expired", "GitHub token expired yesterday"),
    ("service-key-uuid", "Slack token 550e8400-e29b-41d4-a716-446655440000 was revoked"),
    ("pw-abbrev-talk", "pw 是 password 的缩写"),
    ("pw-manager", "my pw manager is 1Password"),
    ("door-code-changed", "the door code changed yesterday"),
    ("case-sensitive-colon", "password: case-sensitive"),
    ("passphrase-advice", "a passphrase is easier to remember than a password"),
    ("password-manager-spaced", "我的密码是 password manager 生成的"),
    ("master-password-talk", "master password is required to unlock"),
    # spaced English words after "password is" that describe it (look-alikes of the en-spaced group)
    ("password-in-drawer", "the password is in the drawer"),
    ("password-too-short", "my password is too short"),
    ("password-policy-question", "what is the password policy"),
    ("password-on-router", "the wifi password is on the back of the router"),
    ("password-case-sensitive-spaced", "my password is case sensitive"),
    ("password-at-least", "the password is at least twelve characters"),
    ("password-very-strong", "my password is very strong"),
    ("password-hard-to-remember", "the password is hard to remember"),
    ("password-stored-securely", "my password is stored securely"),
    ("password-not-working", "the password is not working, help"),
    ("password-reset-last-week", "my password was reset last week"),
    ("password-dog-name-en", "the password is the name of my first dog"),
    ("password-expiring-soon", "my password is expiring soon"),
    ("password-long-and-random", "your password is long and random"),
    ("password-eight-characters", "the password is 8 characters long"),
    ("password-changed-to-something", "I changed my password to something easier"),
    # a word after another language's "is" may describe the password: only a value with a digit or sign
    ("passwort-falsch", "Das Passwort ist falsch"),
    ("passwort-geheim", "Mein Passwort ist geheim."),
    ("contrasena-incorrecta", "la contraseña es incorrecta"),
    ("fullwidth-password-question", "ｐａｓｓｗｏｒｄ是多少？"),
    ("traditional-password-question", "密碼是多少別告訴別人"),
]
