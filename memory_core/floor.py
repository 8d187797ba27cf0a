"""The relevance floor: what counts as evidence that a memory is about the message at all (issue 16)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .policy import HAN

#: The frame of a request at a message's start ("Write …", 帮我写…): the verb says what to do, not what
#: about, so it is no evidence. Only the leading frame ("what did Melanie recommend?" keeps its verb).
_FRAME = re.compile(
    r"^\s*(?:(?:please|pls|hey|ok|okay|so)[\s,]+)*(?:(?:can|could|would|will) you\s+(?:please\s+)?)?"
    r"(?:write|translate|explain|summari[sz]e|convert|tell me|give me|create|generate|draft|compose|"
    r"recommend|suggest|help me(?: to)?|show me|make)\b"
    r"|^\s*(?:请|麻烦)?你?(?:帮我|给我|替我|帮忙)?(?:写|翻译|解释|总结|推荐|讲|起|生成|创作|编)"
    r"(?:一下|一首|一段|一个|一篇|一封|几本|几个|个|点)?",
    re.I,
)
_TRANSLATE = re.compile(r"translat|翻译|译成|译为", re.I)
_QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|「[^」]*」|'[^']{3,}'|‘[^’]*’")
_TARGET = re.compile(rf"\b(?:in|into|to)\s+[A-Za-z]+\s*[:：]?|(?:成|为|到)[{HAN}]{{1,4}}(?:语|文)", re.I)


def evidence_query(query: str) -> str:
    """The part of `query` that can be evidence about the person: a request's framing verb and the material a
    translation hands over removed (docs/MEMORY.md, "The relevance floor")."""
    translating = _TRANSLATE.search(query) is not None
    query = _FRAME.sub(" ", query, count=1)
    if translating:
        query = _QUOTED.sub(" ", query)
        query = re.split(r"[:：]", query, maxsplit=1)[0]
        query = _TARGET.sub(" ", query)
    return query


#: Statements about nobody in particular, in the two languages a person writes to Lucid in: the null
#: against which a cosine has to stand out. Keep them ordinary, varied and unlike any request.
REFERENCE: tuple[str, ...] = (
    "我昨天买了一把新雨伞",
    "楼下的便利店晚上十点关门",
    "我表哥在深圳开了一家修车店",
    "我们小区的电梯上周坏了",
    "我小时候学过两年书法",
    "会议室的投影仪需要换灯泡",
    "我邻居家的孩子在学小提琴",
    "我每个月交一次水电费",
    "公司食堂周五有红烧肉",
    "我上周去医院看了牙",
    "我的手机屏幕有一道裂痕",
    "我们部门新来了一个实习生",
    "我喜欢在阳台上种薄荷",
    "地铁二号线早高峰很挤",
    "I bought a new umbrella yesterday",
    "The corner shop closes at ten",
    "My cousin runs a bike repair shop in Leeds",
    "The elevator in our building broke last week",
    "I took calligraphy lessons as a child",
    "The projector in the meeting room needs a new bulb",
    "My neighbour's kid is learning the violin",
    "I pay the water bill once a month",
    "The canteen serves stew on Fridays",
    "I went to the dentist last week",
    "My phone screen has a crack in it",
    "A new intern joined our team",
    "I grow mint on the balcony",
    "The morning train is always crowded",
)
#: How far above the reference statements a cosine must be, in units of their spread: the smallest
#: fold choice of k-fold cross-validation on LoCoMo and MADial, both embedders (bench/relevance_floor.py).
DENSE_MARGIN = 3.0

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class DenseFloor:
    """One embedder's reference vectors (passages, L2-normalised): the floor for a query is the highest
    cosine the query reaches on them, plus `margin` × their spread."""

    reference: FloatArray
    margin: float = DENSE_MARGIN

    @classmethod
    def of(cls, vectors: Sequence[Sequence[float]], margin: float = DENSE_MARGIN) -> DenseFloor:
        return cls(np.asarray(vectors, dtype=np.float64), margin)

    def floor(self, query_vector: Sequence[float] | FloatArray) -> float:
        if self.reference.size == 0:
            return -1.0
        cos = self.reference @ np.asarray(query_vector, dtype=np.float64).reshape(-1)
        return float(cos.max() + self.margin * cos.std())
