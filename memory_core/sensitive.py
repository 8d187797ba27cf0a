"""Sensitive categories (DESIGN §5): health, finances, relationships, identity numbers (`is_sensitive`)."""

from __future__ import annotations

import re
from functools import lru_cache

from .secretscan import contains_secret

_CATEGORIES: dict[str, tuple[str, ...]] = {
    "health": (
        "病",
        "医院",
        "医生",
        "看病",
        "体检",
        "检查报告",
        "手术",
        "住院",
        "药",
        "过敏",
        "糖尿病",
        "高血压",
        "抑郁",
        "焦虑",
        "失眠",
        "怀孕",
        "孕",
        "癌",
        "肿瘤",
        "心理咨询",
        "残疾",
        "hiv",
        "艾滋",
        "health",
        "ill\\b",
        "illness",
        "sick",
        "disease",
        "diabet",
        "cancer",
        "tumou?r",
        "allerg",
        "asthma",
        "medic",
        "pills?\\b",
        "prescription",
        "therapy",
        "therapist",
        "depress",
        "anxiety",
        "adhd",
        "autism",
        "pregnan",
        "surgery",
        "hospital",
        "doctor",
        "diagnos",
        "blood pressure",
        "insulin",
        "disabilit",
    ),
    "finances": (
        "工资",
        "薪水",
        "薪资",
        "月薪",
        "年薪",
        "收入",
        "存款",
        "欠款",
        "欠债",
        "负债",
        "贷款",
        "房贷",
        "车贷",
        "信用卡",
        "银行卡",
        "银行账",
        "股票",
        "理财",
        "破产",
        "借钱",
        "salary",
        "income",
        "debt",
        "loan",
        "mortgage",
        "bank account",
        "credit card",
        "savings",
        "bankrupt",
        "owe ",
        "paycheck",
        "net worth",
        "tax return",
    ),
    "relationships": (
        "男朋友",
        "女朋友",
        "男友",
        "女友",
        "老婆",
        "老公",
        "丈夫",
        "妻子",
        "前任",
        "离婚",
        "结婚",
        "婚姻",
        "分手",
        "出轨",
        "暗恋",
        "约会",
        "恋爱",
        "相亲",
        "性取向",
        "同性恋",
        "boyfriend",
        "girlfriend",
        "husband",
        "wife",
        "partner",
        "divorc",
        "married",
        "marriage",
        "break ?up",
        "broke up",
        "affair",
        "dating",
        "my ex\\b",
        "crush",
        "sexual",
        "gay\\b",
        "lesbian",
    ),
    "identity_number": (
        "身份证",
        "护照",
        "社保号",
        "驾照号",
        "学号",
        "工号",
        "银行卡号",
        "手机号",
        "passport",
        "social security",
        "ssn",
        "id number",
        "id card",
        "driver'?s licen[cs]e",
        "tax id",
    ),
}
_ID_DIGITS = re.compile(r"(?<!\d)(\d{15}|\d{17}[\dXx]|\d{9}|\d{3}-\d{2}-\d{4})(?!\d)")


def _pattern(words: tuple[str, ...]) -> re.Pattern[str]:
    latin = [w for w in words if w.isascii()]
    cjk = [re.escape(w) for w in words if not w.isascii()]
    return re.compile("|".join(cjk + [rf"\b{w}" for w in latin]), re.I)


_PATTERNS = {name: _pattern(words) for name, words in _CATEGORIES.items()}


@lru_cache(maxsize=50_000)
def sensitive_categories(text: str) -> frozenset[str]:
    """The sensitive categories `text` falls in (empty: none)."""
    found = {name for name, pattern in _PATTERNS.items() if pattern.search(text)}
    if _ID_DIGITS.search(text) or contains_secret(text):
        found.add("identity_number")
    return frozenset(found)


def is_sensitive(text: str) -> bool:
    """Whether `text` falls in a sensitive category (never shown outside its private chat but by `/share`).
    Errs towards "sensitive": a false alarm costs a group one memory, a miss a person their privacy."""
    return bool(sensitive_categories(text))
