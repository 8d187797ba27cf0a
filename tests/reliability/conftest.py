"""Reliability suite: fixtures, scaling, and the figures every test reports.

Fast by default (`pytest` / `pytest tests/reliability`): tests marked `slow` are deselected unless a marker
expression is given, so CI runs the fast subset of every category. The full run (pytest-xdist, a module per
worker; most of the faults module waits on timeouts, so three workers fit two cores):

    pytest tests/reliability -m "slow or not slow" -n 3 --dist loadscope

Sizes scale with environment variables (documented in docs/RELIABILITY.md), e.g. LUCID_RELIABILITY_EVENTS.
Each test records its figures with the `figures` fixture; they are printed at the end of the run and, with
LUCID_RELIABILITY_REPORT=path.json, written to that file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fakes.feishu import FakeFeishu
from tests.fakes.ollama import FakeOllama
from tests.reliability.harness import BOT, ByText, Stack

MODEL = "qwen3:4b"

HERE = Path(__file__).resolve().parent
_FIGURES: dict[str, dict[str, Any]] = {}
FULL_RUN_ORDER = (
    "test_load",
    "test_faults",
    "test_isolation",
    "test_secrets",
    "test_hostile",
    "test_disk_full",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a marker expression, the slow tests are deselected (not skipped): the default run is the
    fast subset; `-m "slow or not slow"` runs everything."""
    if config.getoption("markexpr", ""):
        # The full run (`-n 3 --dist loadscope`, one module per worker at a time): the longest modules
        # first, so the 10,000-event load starts at once and the rest fills the other workers around it.
        rank = {name: i for i, name in enumerate(FULL_RUN_ORDER)}
        items.sort(key=lambda i: rank.get(Path(str(i.fspath)).stem, len(rank)))
        return
    slow = [
        i for i in items if i.get_closest_marker("slow") and HERE in Path(str(i.fspath)).resolve().parents
    ]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i not in slow]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("reliability figures")
    for name, values in _FIGURES.items():
        terminalreporter.write_line(f"{name}: {json.dumps(values, ensure_ascii=False, sort_keys=True)}")
    target = os.environ.get("LUCID_RELIABILITY_REPORT")
    if target:
        Path(target).write_text(json.dumps(_FIGURES, ensure_ascii=False, indent=1, sort_keys=True), "utf-8")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect each test's figures from its report: with `-n` (pytest-xdist) tests run in other processes,
    and their reports (with `user_properties`) are what reaches this one."""
    if report.when != "teardown":
        return
    for key, value in report.user_properties:
        if key == "reliability_figures" and value:
            _FIGURES[report.nodeid.split("::", 1)[-1]] = value


class Figures:
    def __init__(self, name: str) -> None:
        self.name = name
        self.values: dict[str, Any] = _FIGURES.setdefault(name, {})

    def __setitem__(self, key: str, value: Any) -> None:
        self.values[key] = value

    def update(self, **values: Any) -> None:
        self.values.update(values)


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    found = Figures(request.node.nodeid.split("::", 1)[-1])
    request.node.user_properties.append(("reliability_figures", found.values))
    return found


@pytest.fixture
def feishu() -> Iterator[FakeFeishu]:
    with FakeFeishu(bot_open_id=BOT) as fake:
        yield fake


@dataclass
class Shared:
    """One `lucid bot` and one `lucid worker` process (chat model on FakeOllama, scripted per message), shared by
    the tests that neither kill nor reconfigure processes: starting processes is most of a small test's
    time on two cores. Each test starts from an empty Redis and uses its own people and message texts."""

    stack: Stack
    feishu: FakeFeishu
    ollama: FakeOllama
    model: ByText


@pytest.fixture(scope="session")
def _shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    from workers import embedded_redis

    # Its own redis-server: a worker listens on every queue of its Redis, so two stacks on one Redis would
    # take each other's jobs.
    server = embedded_redis.start(tmp_path_factory.mktemp("shared-redis"), persist=False)
    model = ByText()
    try:
        with FakeFeishu(bot_open_id=BOT) as fake, FakeOllama(responder=model) as ollama:
            stack = Stack(
                tmp_path_factory.mktemp("shared"),
                server.url,
                fake,
                bots=1,
                workers=1,
                ollama_url=ollama.url,
                chat_model=MODEL,
            )
            with stack:
                yield Shared(stack, fake, ollama, model)
    finally:
        server.stop()


@pytest.fixture
def shared(_shared: Shared) -> Iterator[Shared]:
    client = redis.Redis.from_url(_shared.stack.redis_url)
    client.flushdb()  # no cooldown flag, queue or inbox of an earlier test
    _shared.model.replies.clear()
    _shared.model.extractions.clear()
    assert _shared.stack.bots_by_index(0).alive and _shared.stack.live_workers
    yield _shared
    _shared.stack.settle(60)
    client.close()
