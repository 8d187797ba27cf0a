"""Disk full during a write (ENOSPC on a small tmpfs in a private mount namespace): a clear error, no torn
file, nothing lost that was acknowledged, and writes resume once space is freed."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.reliability.harness import on_small_tmpfs

SCRIPT = textwrap.dedent(
    """
    import json, random, sys
    from pathlib import Path
    from memory_core.errors import StoreError
    from memory_core.lineformat import parse_file
    from memory_core.namespace import Namespace
    from memory_core.ops import Remember
    from memory_core.store import Store
    from memory_core.writer import Writer
    data = Path(sys.argv[1])
    ns = Namespace.of("t", "u", "p")
    w = Writer(Store(data))
    rng = random.Random(1)
    acked, error = [], None
    for i in range(5000):
        text = "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(600))
        try:
            out = w.submit(ns, [Remember(text=text)])[0]
        except StoreError as exc:
            error = str(exc)
            break
        acked.append(text)
    memory = (data / "t/u/p/MEMORY.md").read_text("utf-8")
    doc = parse_file(memory)
    texts = {e.text for e in doc.entries()}
    temps = [p.name for p in (data / "t/u/p").iterdir() if p.name.endswith(".tmp")]
    # free space: drop the raw git objects' pack garbage by removing a filler, then write again
    (data / "filler").unlink()
    resumed = w.submit(ns, [Remember(text="空间释放之后的第一条")])[0].status
    final = {e.text for e in parse_file((data / "t/u/p/MEMORY.md").read_text("utf-8")).entries()}
    print(json.dumps({"error": error, "acked": len(acked), "lost": [t for t in acked if t not in final],
                      "problems": len(doc.problems()), "temps": temps, "resumed": resumed,
                      "first_kept": acked[0] in texts if acked else None}))
    """
)


def test_disk_full_is_a_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    result = on_small_tmpfs(tmp_path, SCRIPT, filler_bytes=300_000)
    assert result["error"] and "disk full" in result["error"]  # the clear error a user or operator sees
    assert result["acked"] > 0 and result["first_kept"]
    assert result["lost"] == []  # every acknowledged write is in the file
    assert result["problems"] == 0 and result["temps"] == []  # no torn file, no temp left behind
    assert result["resumed"] == "added"
