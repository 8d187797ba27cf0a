"""Prompt-injection markers: text that reads as an order to the model rather than a memory
(`carries_instruction`)."""

from __future__ import annotations

import re
import unicodedata

_INSTRUCTION = re.compile(
    r"\b(?:ignore|disregard|forget|override|bypass)\b[^.。\n]{0,30}?\b(?:previous|prior|above|earlier|preceding|"
    r"all|any|the|your|system)\b[^.。\n]{0,20}?\b(?:instructions?|prompts?|rules?|messages?|context|memor(?:y|ies))\b|"
    r"\b(?:delete|erase|wipe|purge|destroy)\b|\bremove (?:all|every(?:thing)?)\b|\bforget everything\b|"
    r"\b(?:system|developer) prompt\b|\byou are now\b|\bnew instructions?\b|\bjailbreak\b|rm -rf|drop table|"
    r"忽略(?:之前|以上|前面|上面|先前|此前|所有|全部)|无视(?:之前|以上|前面|所有)|不要理会|"
    r"删除|删掉|清空|清除|抹掉|忘掉(?:所有|一切|全部)|忘记(?:所有|一切|全部)|系统提示|你现在是|新的指令|"
    r"(?:指令|指示)[:：]",
    re.I,
)


def instructions(text: str) -> frozenset[str]:
    """Instruction-like phrases in `text` (prompt-injection markers), lower-cased."""
    return frozenset(m.group(0).lower() for m in _INSTRUCTION.finditer(unicodedata.normalize("NFKC", text)))


def carries_instruction(text: str) -> bool:
    """Whether `text` reads as an instruction to the bot (忽略之前的所有指令): stored as data, it never acts.
    Errs towards catching too much: the cost is a fact left out of tidying, never a fact lost."""
    return _INSTRUCTION.search(unicodedata.normalize("NFKC", text)) is not None
