"""forget --purge and erase on one namespace of N commits (one message + one memory each).

.venv/bin/python bench/purge.py 1000
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from memory_core.entry import utcnow
from memory_core.lineformat import RawMessage
from memory_core.namespace import Namespace
from memory_core.ops import Record, Remember, message_to_json
from workers import erasure
from workers.runtime import build
from workers.settings import Settings


def main(n: int) -> None:
    rt = build(Settings(data_dir=Path(tempfile.mkdtemp())), None, git=True)
    ns = Namespace.of("t", "ou_person_000001", "default")
    for i in range(n):
        said = RawMessage(id=f"m{i}", ts=utcnow(), speaker="u", text=f"第{i}条消息 我喜欢{i}号咖啡")
        rt.writer.submit(
            ns, [Record(message=message_to_json(said)), Remember(f"我喜欢{i}号咖啡馆的拿铁", origin=f"m{i}")]
        )
    target = rt.writer.snapshot(ns)[0].entries()[n // 2].id
    started = time.perf_counter()
    outcome = erasure.purge(rt, ns, target)
    purge = time.perf_counter() - started
    started = time.perf_counter()
    erasure.erase_user(rt, "ou_person_000001")
    erase = time.perf_counter() - started
    print(f"commits={n} purge={purge:.2f}s ({outcome.status}) erase={erase:.3f}s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
