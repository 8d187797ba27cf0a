"""Disk full during a write (ENOSPC on a small tmpfs in a private mount namespace): a clear error, no torn
file, nothing lost that was acknowledged, and writes resume once space is freed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

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
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("this test needs util-linux's `unshare` to mount a private tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(SCRIPT)
    inner = (
        f"mount -t tmpfs -o size=1500k tmpfs {mnt} && "
        f"head -c 300000 /dev/zero > {mnt}/filler && "
        f"{sys.executable} {script} {mnt}"
    )
    args = [unshare, "--mount", "--propagation", "private"]
    if subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip() != "0":
        args.insert(1, "--map-root-user")
    out = subprocess.run([*args, "sh", "-c", inner], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] and "disk full" in result["error"]  # the clear error a user or operator sees
    assert result["acked"] > 0 and result["first_kept"]
    assert result["lost"] == []  # every acknowledged write is in the file
    assert result["problems"] == 0 and result["temps"] == []  # no torn file, no temp left behind
    assert result["resumed"] == "added"
