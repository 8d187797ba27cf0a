"""Questions naming a day, over the raw archive: does raw search return what was said that day?

    python bench/eval_zh_dates.py /work/shared/data/memorybank-siliconfriend --json [--lang en]

MemoryBank (SiliconFriend) cn (or en): per user, each day's exchanges are imported into one RawIndex (the user's query
and the companion's response as two messages at that day's date, one session a day). Each probing question
that names a day (5月2日, 4月27号; en: May 2nd) is searched; a question scores at k when a top-k hit was said on that day.
The day is read with this file's own pattern, not the product's, so the harness runs unchanged on older code.
Days outside a user's history are counted and skipped. There are no gold answers: this scores the day only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memory_core.lineformat import RawMessage
from memory_core.rawindex import RawIndex
from memory_core.timeexpr import MONTHS

NAMED_DAY = {
    "cn": re.compile(r"(\d{1,2})月(\d{1,2})[日号]"),
    "en": re.compile(rf"\b({'|'.join(MONTHS)}) (\d{{1,2}})(?:st|nd|rd|th)?\b", re.I),
}
COMPANION = {"cn": "AI伴侣", "en": "AI companion"}


def history_messages(
    user: str, history: dict[str, list[dict[str, str]]], companion: str = COMPANION["cn"]
) -> list[RawMessage]:
    """One session a day: the user's query and the companion's response, two minutes a turn from noon UTC."""
    out: list[RawMessage] = []
    for day, turns in sorted(history.items()):
        noon = datetime.fromisoformat(day).replace(hour=12, tzinfo=UTC)
        for i, turn in enumerate(turns):
            for j, (speaker, text) in enumerate(((user, turn["query"]), (companion, turn["response"]))):
                out.append(
                    RawMessage(
                        id=f"{day}-{i}-{j}",
                        ts=noon + timedelta(minutes=2 * i + j),
                        speaker=speaker,
                        text=text,
                        chat=user,
                        role="user" if j == 0 else "assistant",
                        session=day,
                    )
                )
    return out


def evaluate(data_dir: Path, ks: tuple[int, ...], lang: str = "cn") -> dict[str, Any]:
    raw = json.loads((data_dir / f"memory_bank_{lang}.json").read_text(encoding="utf-8"))
    bank = {name.strip(): user for name, user in raw.items()}  # the en bank writes " Jason "
    probes: dict[str, list[str]] = {}
    for line in (data_dir / f"probing_questions_{lang}.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            probes.update(json.loads(line))
    hits = dict.fromkeys(ks, 0)
    scored, outside, rows = 0, 0, []
    for user, questions in probes.items():
        history = bank[user]["history"]
        year = int(min(history)[:4])
        index = RawIndex()
        index.add_many(history_messages(user, history, COMPANION[lang]))
        for question in questions:
            named = NAMED_DAY[lang].search(question)
            if named is None:
                continue
            month = int(named[1]) if named[1].isdigit() else MONTHS.index(named[1].lower()) + 1
            day = date(year, month, int(named[2]))
            if day.isoformat() not in history:
                outside += 1
                continue
            scored += 1
            found = [hit.ts.astimezone(UTC).date() == day for hit in index.search(question, k=max(ks))]
            for k in ks:
                hits[k] += any(found[:k])
            rank = found.index(True) + 1 if any(found) else None
            rows.append({"user": user, "question": question, "day": day.isoformat(), "first_rank": rank})
    return {
        "questions": scored,
        "outside_history": outside,
        "recall": {f"R@{k}": round(100 * hits[k] / scored, 1) if scored else 0.0 for k in ks},
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--k", default="1,5,10")
    parser.add_argument("--lang", choices=("cn", "en"), default="cn")
    parser.add_argument("--json", action="store_true", help="the whole result, rows included, as JSON")
    args = parser.parse_args()
    result = evaluate(args.data_dir, tuple(int(k) for k in args.k.split(",")), args.lang)
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=1))
    else:
        recall = "  ".join(f"{name} {value}" for name, value in result["recall"].items())
        print(f"{result['questions']} questions naming a day ({result['outside_history']} outside): {recall}")


if __name__ == "__main__":
    main()
