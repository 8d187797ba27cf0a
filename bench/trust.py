"""The trust suite's score: pass / total per class of scenario (one class = one tests/trust module).

    python bench/trust.py [--json] [-k EXPR]

Runs `pytest tests/trust` once with `--junitxml` to a temporary file and counts each test case by the
module it lives in (test_supersede.py → supersede). A case passes when it has no failure, error or skip.
The exit code is pytest's, so a failing scenario fails the bench too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def score(junit: Path) -> dict[str, dict[str, int]]:
    """{class: {"passed": n, "total": n}} from a JUnit XML report."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"passed": 0, "total": 0})
    for case in ET.parse(junit).getroot().iter("testcase"):
        parts = (case.get("classname") or "").split(".")  # tests.trust.test_history[.TestUndo]
        module = next((p for p in parts if p.startswith("test_")), parts[-1])
        name = module.removeprefix("test_") or "other"
        counts[name]["total"] += 1
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            counts[name]["passed"] += 1
    return dict(sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-k", help="only scenarios matching this pytest expression")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "trust.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/trust",
            f"--junitxml={junit}",
        ]
        if args.k:
            cmd += ["-k", args.k]
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if not junit.exists():
            print(run.stdout[-2000:], run.stderr[-2000:], file=sys.stderr)
            return run.returncode or 1
        classes = score(junit)
    passed = sum(c["passed"] for c in classes.values())
    total = sum(c["total"] for c in classes.values())
    if args.json:
        print(
            json.dumps({"classes": classes, "passed": passed, "total": total}, ensure_ascii=False, indent=2)
        )
    else:
        width = max((len(n) for n in classes), default=5)
        for name, c in classes.items():
            print(f"{name:<{width}}  {c['passed']:>3} / {c['total']:<3}")
        print(f"{'total':<{width}}  {passed:>3} / {total:<3}")
    return run.returncode


if __name__ == "__main__":
    raise SystemExit(main())
