"""Headless Chromium for page tests: Debian's `chromium`, driven by Playwright (no browser download).

The suite provisions what it needs: if `chromium` is missing and we are root with apt (a fresh CI machine),
it is installed from the distribution's packages; otherwise the test fails saying how to install it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium", "fonts-wqy-microhei"],
            check=True,
            env=env,
            capture_output=True,
            timeout=900,
        )
        found = shutil.which("chromium")
        if found:
            return found
    raise RuntimeError("the viewer test needs Chromium: apt-get install chromium (or put `chromium` on PATH)")
