"""Benchmark of dreaming's host side: the light phase at 1k / 10k / 100k entries, and the deep phase's
overhead per cluster without the model. Prints one JSON object.

    .venv/bin/python bench/dream.py                      # sizes 1000,10000,100000; naive pass up to 3000
    .venv/bin/python bench/dream.py --sizes 1000,10000 --naive-max 10000

Data: one synthetic namespace per size, Chinese and English memory-like sentences from templates, with
10 % near-duplicates (a particle added, a character changed), 5 % same-subject contradictions (a newer
value for an attribute stated earlier), ages spread over 400 days, 10 % preferences, 2 % rules /
identities / instructions, 1 % pinned, some recall hits. Zero model calls in the light phase.

Light phase, measured separately: `parse` (MEMORY.md text → Book, what every run pays), `plan`
(`plan_light`), `apply` (`apply_light` on the Book), `render` (Book → text). The goals (light ≤ 1 s at
10k, ≤ 12 s at 100k, on 2 cores) are for plan + apply (`light_s` wall clock; `light_cpu_s` the CPU time,
which other load on a shared machine does not inflate). The naive baseline is the reference system's
O(n²) pairwise Jaccard pass over the same entries; both must find the same duplicate pairs.

Deep phase: `plan_clusters` over a 10k-entry namespace plus, per cluster, building the prompt, a model
answering instantly (an in-process stub returning a valid merge; and, with --http, FakeOllama over HTTP
through the real client), the cage review and `apply_deep`. Goal ≤ 50 ms host overhead per cluster.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import random
import re
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memory_core.book import Book
from memory_core.dream_deep import apply_deep, merge_messages, plan_clusters, review_reply
from memory_core.dream_light import apply_light, plan_light
from memory_core.entry import Entry
from memory_core.lineformat import parse_file, render_file
from memory_core.policy import HAN, protected
from memory_core.similarity import DUPLICATE, bigrams

NOW = datetime(2026, 6, 20, 9, 0, tzinfo=UTC)
FOODS = [
    "火锅",
    "寿司",
    "拉面",
    "饺子",
    "烤鸭",
    "咖喱",
    "披萨",
    "沙拉",
    "牛排",
    "小笼包",
    "麻辣烫",
    "螺蛳粉",
    "煎饼",
    "炒饭",
    "凉皮",
    "羊肉串",
    "酸菜鱼",
    "烧麦",
    "馄饨",
    "粥",
]
PLACES = [
    "西湖",
    "外滩",
    "鼓楼",
    "颐和园",
    "南锣鼓巷",
    "太古里",
    "三里屯",
    "滨江",
    "钱塘江",
    "玄武湖",
    "中山陵",
    "宽窄巷子",
    "洪崖洞",
    "解放碑",
    "灵隐寺",
    "千岛湖",
    "乌镇",
    "西溪",
    "湘湖",
    "良渚",
]
DOING = [
    "跑步",
    "骑车",
    "散步",
    "拍照",
    "喝茶",
    "看书",
    "露营",
    "钓鱼",
    "爬山",
    "滑板",
    "写生",
    "遛狗",
    "打球",
    "听歌",
    "野餐",
]
PEOPLE = [
    "张伟",
    "王芳",
    "李娜",
    "刘洋",
    "陈静",
    "杨帆",
    "赵磊",
    "黄丽",
    "周杰",
    "吴敏",
    "徐涛",
    "孙悦",
    "马超",
    "朱琳",
    "胡军",
    "郭靖",
    "林峰",
    "何静",
    "高远",
    "罗兰",
]
RELATION = ["同事", "老同学", "表哥", "邻居", "导师", "室友", "队友", "发小", "客户", "合伙人"]
TOPICS = [
    "Rust",
    "Kubernetes",
    "Postgres",
    "Redis",
    "Kafka",
    "React",
    "Django",
    "Flink",
    "Spark",
    "Terraform",
]
CITIES = [
    "Berlin",
    "Paris",
    "Tokyo",
    "Seoul",
    "Austin",
    "Boston",
    "Lisbon",
    "Madrid",
    "Dublin",
    "Oslo",
    "Vienna",
    "Prague",
    "Zurich",
    "Milan",
    "Sydney",
]
CLAUSES = [
    "喜欢吃{food}",
    "常去{place}{doing}",
    "{person}是我的{relation}",
    "最近在学{topic}",
    "下个月去{city}出差",
    "孩子{n}岁了",
    "每周{doing}{n}次",
    "住在{place}附近",
    "不吃{food}",
    "和{person}合租",
    "早上{n}点起床",
    "周{wd}要{doing}",
    "在{city}读的大学",
    "养了一只猫叫{pet}",
    "车牌尾号是{n}",
    "{person}推荐了{food}",
    "用{topic}写后端",
    "对{food}过敏",
    "生日在{n}月",
    "每天喝{drink}",
]
EN_CLAUSES = [
    "I meet {person} in {city} every {wd}",
    "my team moved to {topic}",
    "I prefer {drink} before {n} am",
    "my cat {pet} hates {food}",
    "I studied in {city}",
    "{person} is my {relation}",
]
PETS = ["Mimi", "Lucky", "Coco", "Momo", "Nana", "Bobo", "Tiger", "Luna", "Milo", "Kiki"]
DRINKS = ["美式", "拿铁", "龙井", "普洱", "豆浆", "果汁", "乌龙", "抹茶"]
WEEKDAYS = ["一", "二", "三", "四", "五", "六", "日"]


COMMON = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而"
    "方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应"
    "开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命"
    "此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求"
    "老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光"
)
SURNAMES = list(
    "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈姚卢"
)


def en_word(rng: random.Random) -> str:
    return "".join(rng.choice("bcdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(2, 3)))


def word(rng: random.Random, k: int = 2) -> str:
    return "".join(rng.choice(COMMON) for _ in range(k))


def sentence(rng: random.Random) -> str:
    """Two or three clauses about different things, with a realistic vocabulary (people, places and
    notes are drawn from thousands of values): distinct memories rarely share more than a clause."""
    slots = dict(
        food=rng.choice(FOODS),
        place=word(rng) + rng.choice("路街园湖山桥村"),
        doing=rng.choice(DOING),
        person=rng.choice(SURNAMES) + word(rng, rng.choice((1, 2))),
        relation=rng.choice(RELATION),
        topic=rng.choice(TOPICS),
        city=rng.choice(CITIES),
        n=rng.randint(1, 99),
        pet=rng.choice(PETS),
        drink=rng.choice(DRINKS),
        wd=rng.choice(WEEKDAYS),
        note=word(rng, rng.randint(3, 6)),
    )
    if rng.random() < 0.15:
        slots.update(person=en_word(rng).capitalize(), pet=en_word(rng).capitalize(), food=en_word(rng))
        return (
            ", ".join(c.format(**slots) for c in rng.sample(EN_CLAUSES, 2))
            + f" near {en_word(rng)} {en_word(rng)}"
        )
    clauses = rng.sample(CLAUSES, rng.choice((2, 3)))
    return "，".join(c.format(**slots) for c in clauses) + f"，{slots['note']}"


def near_duplicate(text: str, rng: random.Random) -> str:
    edits = [
        lambda t: t + "了",
        lambda t: t + "。",
        lambda t: t.replace("，", "，也", 1),
        lambda t: "其实" + t,
    ]
    return rng.choice(edits)(text)


ZH_SHARE = 0.85  # a Feishu bot's memories are mostly Chinese
_SPEAKER = re.compile(r"<[^>]{1,40}>:\s*")
_HAN = re.compile(f"[{HAN}]")
_CLAUSE_SPLIT = re.compile(r"(?<=[，。！？；,.!?;])\s*")


def real_clauses(data: Path) -> list[str]:
    """Clauses of real conversations and memories (LoCoMo, MADial-Bench, MemoryBank; zh and en)."""
    texts: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("text", "event", "query", "response") and isinstance(value, str):
                    texts.append(value)
                elif key == "dialogue" and isinstance(value, list):
                    texts.extend(str(u) for u in value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads((data / "locomo-dev.json").read_text("utf-8")))
    for name in ("memory_bank_cn.json", "memory_bank_en.json"):
        walk(json.loads((data / "memorybank-siliconfriend" / name).read_text("utf-8")))
    for path in sorted((data / "madial-bench").glob("*.json")):
        for line in path.read_text("utf-8").splitlines():
            if line.strip():
                walk(json.loads(line))
    pieces = (c.strip(' "\n') for t in texts for c in _CLAUSE_SPLIT.split(_SPEAKER.sub("", t)))
    clauses = {c for c in pieces if len(c) >= 6 and "<" not in c}
    return sorted(clauses)


class CharChain:
    """A first-order character chain trained on real Chinese clauses: new sentences with the bigram
    statistics of real text (the common bigrams are common, names and places rare), so that distinct
    memories overlap as much as real ones do. There are too few real clauses for 100,000 memories."""

    def __init__(self, texts: list[str]) -> None:
        self.next: dict[str, list[str]] = defaultdict(list)
        self.starts = [t[0] for t in texts if t]
        for t in texts:
            for a, b in itertools.pairwise(t):
                self.next[a].append(b)

    def sentence(self, rng: random.Random) -> str:
        out = [rng.choice(self.starts)]
        for _ in range(rng.randint(8, 30)):
            options = self.next.get(out[-1])
            out.append(rng.choice(options) if options else rng.choice(self.starts))
        return "".join(out)


def make_entries(n: int, seed: int = 1, clauses: list[str] | None = None) -> list[Entry]:
    """A namespace: 10 % near-duplicates, 5 % contradictions, realistic types, ages and hits. Texts are
    85 % Chinese sentences from a character chain trained on real clauses, 15 % one or two real English
    clauses (see `real_clauses`), or synthetic template sentences when the data is absent."""
    rng = random.Random(seed)
    zh = CharChain([c for c in clauses or () if _HAN.search(c)])
    en = [c for c in clauses or () if not _HAN.search(c)]

    def fresh() -> str:
        if not clauses:
            return sentence(rng)
        if rng.random() < ZH_SHARE:
            return zh.sentence(rng)
        return rng.choice(en) + (f" {rng.choice(en)}" if rng.random() < 0.5 else "")

    out: list[Entry] = []
    subjects: list[tuple[str, int]] = []
    for i in range(n):
        at = NOW - timedelta(days=rng.uniform(0, 400))
        roll = rng.random()
        kind = rng.choices(
            ["fact", "context", "preference", "rule", "identity", "instruction"], [70, 16, 10, 1, 0.5, 0.5]
        )[0]
        hits = rng.choices([0, 1, 2, 3, 5], [60, 20, 10, 6, 4])[0]
        subject = None
        if roll < 0.10 and out:
            text = near_duplicate(rng.choice(out).text, rng)
        elif roll < 0.15 and subjects:
            subject, _ = rng.choice(subjects)
            text = fresh()
        else:
            text = fresh()
            if rng.random() < 0.06:
                subject = f"attr{len(subjects)}"
                subjects.append((subject, i))
        out.append(
            Entry(
                id=f"{i:016x}",
                text=text,
                type=kind,
                subject=subject,
                at=at,
                hits=hits,
                pinned=rng.random() < 0.01,
            )
        )
    return out


def timed(fn: Any) -> tuple[float, Any]:
    gc.collect()
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def naive_pairs(entries: list[Entry]) -> set[tuple[str, str]]:
    """The reference system's pass: every pair of current, touchable entries, Jaccard on bigrams."""
    pool = [e for e in entries if e.current(NOW) and not protected(e)]
    sets = [bigrams(e.text) for e in pool]
    found = set()
    for i, j in itertools.combinations(range(len(pool)), 2):
        x, y = sets[i], sets[j]
        inter = len(x & y)
        if inter and inter / (len(x) + len(y) - inter) >= DUPLICATE:
            found.add((pool[i].id, pool[j].id))
    return found


def fast_pairs(entries: list[Entry]) -> set[tuple[str, str]]:
    from memory_core.dream_pairs import similar_pairs

    pool = [e for e in entries if e.current(NOW) and not protected(e)]
    return {(pool[i].id, pool[j].id) for i, j, _ in similar_pairs([bigrams(e.text) for e in pool], DUPLICATE)}


def bench_light(n: int, naive_max: int, clauses: list[str] | None) -> dict[str, Any]:
    entries = make_entries(n, clauses=clauses)
    book = Book()
    for e in entries:
        book.add_entry(e)
    text = render_file(book.memory_file())
    parse_s, book = timed(lambda: Book(parse_file(text)))
    cpu0 = time.process_time()
    plan_s, plan = timed(lambda: plan_light(book.entries(), NOW))
    apply_s, result = timed(lambda: apply_light(book, plan, NOW))
    cpu_s = (
        time.process_time() - cpu0
    )  # CPU time of plan + apply: what load on a shared machine does not inflate
    render_s, _ = timed(lambda: (render_file(book.memory_file()), render_file(book.archive_file())))
    second = plan_light(book.entries(), NOW)
    row: dict[str, Any] = {
        "entries": n,
        "parse_s": round(parse_s, 3),
        "plan_s": round(plan_s, 3),
        "apply_s": round(apply_s, 3),
        "render_s": round(render_s, 3),
        "light_s": round(plan_s + apply_s, 3),
        "light_cpu_s": round(cpu_s, 3),
        "counts": result.counts,
        "second_run_ops": len(second),
        "llm_calls": 0,
    }
    if n <= naive_max:
        naive_s, slow = timed(lambda: naive_pairs(entries))
        fast_s, fast = timed(lambda: fast_pairs(entries))
        row["pairs"] = {
            "naive_s": round(naive_s, 3),
            "fast_s": round(fast_s, 3),
            "same_pairs": slow == fast,
            "pairs": len(fast),
        }
    return row


class Stub:
    """A model that answers instantly with a valid merge of the first two memories it is shown."""

    calls = 0

    def __call__(self, messages: list[dict[str, str]]) -> str:
        self.calls += 1
        memories = json.loads(messages[1]["content"])["memories"][:2]
        return json.dumps(
            {
                "merges": [
                    {"ids": [m["id"] for m in memories], "text": "；".join(m["text"] for m in memories)}
                ]
            },
            ensure_ascii=False,
        )


def bench_deep(n: int, http: bool, clauses: list[str] | None) -> dict[str, Any]:
    entries = [
        e.with_changes(hits=min(e.hits, 2), pinned=False, type="fact")
        for e in make_entries(n, seed=2, clauses=clauses)
    ]
    book = Book()
    for e in entries:
        book.add_entry(e)
    known = {e.id for e in entries}
    plan_s, clusters = timed(lambda: plan_clusters(book.entries(), NOW))
    answer = Stub()
    if http:
        from tests.fakes.ollama import FakeOllama
        from workers.llm import LLM

        fake = FakeOllama(models=["stub"], responder=lambda body: answer(body["messages"])).start()
        llm = LLM(fake.url, retries=0)

        def ask(messages: list[dict[str, str]]) -> str:
            return llm.chat("stub", messages, format="json", temperature=0).content
    else:
        ask = answer

    def run() -> int:
        taken: set[str] = set()
        merges = []
        for cluster in clusters:
            merges.extend(review_reply(cluster, ask(merge_messages(cluster)), known, taken).merges)
        return len(apply_deep(book, merges, NOW))

    run_s, accepted = timed(run)
    if http:
        fake.stop()
    per_cluster = (plan_s + run_s) / max(1, len(clusters))
    return {
        "entries": n,
        "model": "FakeOllama over HTTP" if http else "in-process stub",
        "clusters": len(clusters),
        "accepted": accepted,
        "plan_clusters_s": round(plan_s, 4),
        "prompt_review_apply_s": round(run_s, 4),
        "per_cluster_ms": round(per_cluster * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--naive-max", type=int, default=3000, help="largest size for the O(n²) baseline")
    parser.add_argument("--deep-size", type=int, default=10000)
    parser.add_argument("--http", action="store_true", help="also measure the deep phase through FakeOllama")
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--synthetic", action="store_true", help="template sentences instead of real clauses")
    args = parser.parse_args()
    clauses = (
        None if args.synthetic or not (args.data / "locomo-dev.json").exists() else real_clauses(args.data)
    )
    sizes = [int(s) for s in args.sizes.split(",") if s]
    naive_sizes = sorted({s for s in (*sizes, 1000, 3000) if s <= args.naive_max})
    report: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_1m": round(os.getloadavg()[0], 2),
        },
        "texts": f"{len(clauses)} real clauses; 85 % zh (a character chain trained on them), 15 % en (1-2 real clauses)"
        if clauses
        else "synthetic template sentences",
        "light": [bench_light(n, args.naive_max, clauses) for n in sizes],
        "naive_baseline": [
            bench_light(n, args.naive_max, clauses)["pairs"] for n in naive_sizes if n not in sizes
        ],
        "deep": [
            bench_deep(args.deep_size, False, clauses),
            *([bench_deep(args.deep_size, True, clauses)] if args.http else []),
        ],
        "goals": {"light_10k_s": 1.0, "light_100k_s": 12.0, "deep_per_cluster_ms": 50},
    }
    print(json.dumps(report, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
