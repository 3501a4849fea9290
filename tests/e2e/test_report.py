"""``baton report``: the demo run as one self-contained HTML page, checked as markup and in headless Chromium.

Chromium is Debian's ``chromium``; when it is missing the setup installs it once per session
(``apt-get``, as root, with a timeout) and skips the browser tests, saying why, where it cannot.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import time
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_cli import baton, lines, rewrite_worker

from baton.adapters.report import render_html
from baton.domain.budgets import Ceilings, Usage
from baton.domain.events import (
    BlobRef,
    HandoffAccepted,
    HandoffPrepared,
    LeaseGranted,
    Placement,
    RecordedEvent,
    RunOpened,
    StageReserved,
)
from baton.domain.stages import Stage
from baton.projections.report import build_report

# Seconds for apt-get update and install together: under pytest-timeout's 300 s per test, which
# counts this session fixture's set-up against the first test that asks for it, so that a slow
# mirror ends in a skip that says so, not in a timeout.
APT_BUDGET_S = 240
BROWSER_TIMEOUT = 60
FETCHING_TAGS = {"script", "link", "img", "iframe", "object", "embed", "audio", "video", "source", "base", "use"}


class Page(HTMLParser):
    """Every element's tag and attributes, and the page's text, from HTML or from Chromium's dumped DOM."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def by_id(self, element_id: str) -> tuple[str, dict[str, str]]:
        found = [e for e in self.elements if e[1].get("id") == element_id]
        assert len(found) == 1, f"#{element_id}: {len(found)} elements"
        return found[0]

    def classes(self) -> Counter[str]:
        return Counter(c for _, attrs in self.elements for c in attrs.get("class", "").split())


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of Debian's chromium, installed with apt-get if missing; the browser tests skip if it cannot be."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip("chromium is not installed and installing it needs root (apt-get install -y chromium)")
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and there is no apt-get to install it with")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + APT_BUDGET_S
    try:
        for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            left = max(1.0, deadline - time.monotonic())
            done = subprocess.run(command, capture_output=True, text=True, timeout=left, env=env, check=False)
            if done.returncode != 0:
                pytest.skip(f"could not install chromium ({' '.join(command)}): {done.stderr.strip()[-400:]}")
    except subprocess.TimeoutExpired:
        pytest.skip(f"installing chromium took longer than {APT_BUDGET_S} s")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get installed chromium but no `chromium` is on PATH")
    return found


def browse(chromium: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with a throwaway profile; no network is needed by the page."""
    return subprocess.run(
        [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--no-first-run", *args],
        capture_output=True,
        text=True,
        timeout=BROWSER_TIMEOUT,
        check=False,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A directory whose ./baton.db holds the demo's committed run, and the run's id."""
    directory = tmp_path_factory.mktemp("demo")
    result = baton(directory, "demo")
    assert result.returncode == 0, result.stderr
    return directory, str(lines(baton(directory, "runs", "--json").stdout)[0]["run_id"])


@pytest.fixture(scope="module")
def page(demo: tuple[Path, str]) -> Path:
    """The demo run's report, written by `baton report RUN_ID -o run.html`."""
    directory, run_id = demo
    result = baton(directory, "report", run_id, "-o", "run.html")
    assert result.returncode == 0, result.stderr
    assert "23 events, audit ok" in result.stdout
    return directory / "run.html"


def test_the_report_is_one_self_contained_page_with_every_part(page: Path) -> None:
    """Given the demo run, when reported, then one HTML file holds the timeline, stages, epochs, budgets and
    verdict, and nothing in it would fetch anything."""
    html = page.read_text(encoding="utf-8")
    parsed = Page(html)
    tags = {tag for tag, _ in parsed.elements}
    assert not tags & FETCHING_TAGS, tags & FETCHING_TAGS
    for tag, attrs in parsed.elements:
        for name, value in attrs.items():
            assert name not in {"src", "href", "xlink:href", "action", "srcset"}, (tag, name, value)
            assert "//" not in value and "http:" not in value and "https:" not in value, (tag, name, value)
    assert "@import" not in html and "url(http" not in html
    assert "default-src 'none'" in html  # the page's own policy forbids any fetch
    assert parsed.by_id("timeline")[0] == "svg"
    assert "ok" in parsed.by_id("verdict")[1]["class"].split()
    classes = parsed.classes()
    assert classes["stage-band"] == 8  # GENERATING .. COMMITTED, each once
    assert classes["lane"] == 2  # worker-a and worker-b
    assert classes["event"] == 23
    assert classes["epoch-change"] == 2  # epoch 1 (first lease) and epoch 2 (the takeover)
    assert classes["takeover"] == 1
    assert classes["budget-plot"] == 8  # one per counter
    assert classes["ceiling"] == 0  # the demo sets no ceiling
    parsed.by_id("stale-note")
    assert "Rejected stale appends are never stored in the log" in " ".join(parsed.text)


def test_a_tampered_run_shows_the_audit_problems_and_escapes_the_log(demo: tuple[Path, str], tmp_path: Path) -> None:
    """Given event 3's worker rewritten to markup in the database, when reported, then the verdict lists
    digest_mismatch at 3, the mark is flagged, and the markup appears only escaped."""
    directory, run_id = demo
    shutil.copy(directory / "baton.db", tmp_path / "baton.db")
    rewrite_worker(tmp_path / "baton.db", run_id, 3, "<script>alert(1)</script>")

    result = baton(tmp_path, "report", run_id, "-o", "tampered.html")

    assert result.returncode == 0, result.stderr
    html = (tmp_path / "tampered.html").read_text(encoding="utf-8")
    parsed = Page(html)
    assert "<script" not in html and "&lt;script&gt;" in html
    assert "problems" in parsed.by_id("verdict")[1]["class"].split()
    flagged = [a for _, a in parsed.elements if "problem" in a.get("class", "").split() and "data-position" in a]
    assert [a["data-position"] for a in flagged] == ["3"]
    assert "digest_mismatch" in "".join(parsed.text)


def test_an_unknown_run_is_an_error_and_writes_nothing(demo: tuple[Path, str]) -> None:
    """Given a run id the store does not hold, when reported, then exit 1 with a message and no file."""
    directory, _ = demo
    result = baton(directory, "report", "no-such-run", "-o", "none.html")
    assert result.returncode == 1
    assert result.stderr.startswith("baton:")
    assert not (directory / "none.html").exists()


def test_the_model_marks_handoffs_epochs_and_ceilings() -> None:
    """Given a run with ceilings, a reservation and a handoff, when folded and drawn, then the handoff's steps, the
    epoch change at its lease move (not a takeover) and the ceilings are in the model and on the page."""
    ceilings = Ceilings(fuel=100, stages=3)
    state = BlobRef("sha256:01", 1)
    bodies: list[tuple[str, int, object]] = [
        ("w1", 0, RunOpened("rel", "s", 1, BlobRef("sha256:00", 1), ceilings)),
        ("w1", 1, LeaseGranted("w1", 1, Placement("w1"), 10**12)),
        ("w1", 1, StageReserved("st-1", 40, Usage(fuel=0, stages=1, reserved_fuel=40))),
        ("w1", 1, HandoffPrepared("sha256:d0c", Placement("w2"), "ckpt", "m")),
        ("w1", 1, LeaseGranted("w2", 2, Placement("w2"), 10**12)),
        ("w2", 2, HandoffAccepted("sha256:d0c", 1, "rel", "s", 1, state, Usage(), ceilings, Stage.GENERATING)),
    ]
    events = [
        RecordedEvent("r", i, epoch, worker, f"s{i}", 1_000_000 * i, "", body, "")  # type: ignore[arg-type]
        for i, (worker, epoch, body) in enumerate(bodies, start=1)
    ]

    report = build_report("r", events)

    assert [(h.position, h.step, h.destination) for h in report.handoffs] == [
        (4, "prepared", "w2"),
        (6, "accepted", ""),
    ]
    assert [(e.position, e.epoch, e.worker, e.takeover) for e in report.epochs] == [
        (2, 1, "w1", False),
        (5, 2, "w2", False),
    ]
    assert report.epochs[1].how == "handoff from w1"
    budgets = {b.counter: b for b in report.budgets}
    assert (budgets["fuel"].ceiling, budgets["stages"].ceiling, budgets["calls"].ceiling) == (100, 3, None)
    assert budgets["reserved_fuel"].points == ((1, 0), (3, 40))
    assert report.workers == ("w1", "w2")
    assert report.ok
    drawn = Page(render_html(report)).classes()
    assert (drawn["ceiling"], drawn["handoff-link"], drawn["handoff-prepared"], drawn["takeover"]) == (2, 1, 1, 0)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_page_renders_in_headless_chromium(chromium: str, page: Path, tmp_path: Path) -> None:
    """Given the demo's report, when Chromium loads it, then the rendered DOM has the timeline, the stage bands,
    the budget plots and the verdict, and a 1400x1000 screenshot is drawn."""
    dumped = browse(chromium, "--dump-dom", page.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = Page(dumped.stdout)
    assert dom.by_id("timeline")[0] == "svg"
    classes = dom.classes()
    assert classes["stage-band"] == 8
    assert classes["budget-plot"] == 8
    assert classes["event"] == 23
    assert classes["epoch-change"] == 2
    assert "ok" in dom.by_id("verdict")[1]["class"].split()
    assert "Audit: ok." in "".join(dom.text)

    shot = tmp_path / "report.png"
    drawn = browse(chromium, f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri())
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert png_size(shot) == (1400, 1000)
    assert shot.stat().st_size > 20_000  # a blank page compresses to a few kB


LONG_RUN = 100_000


def long_run_report() -> tuple[str, int]:
    """A 100,000-event run drawn: two busy workers and one that appended a single event in the middle."""
    bodies: list[tuple[str, int, object]] = [
        ("w1", 0, RunOpened("rel", "s", 1, BlobRef("sha256:00", 1), Ceilings(fuel=LONG_RUN))),
        ("w1", 1, LeaseGranted("w1", 1, Placement("w1"), 10**15)),
    ]
    for i in range(3, LONG_RUN + 1):
        worker = "lonely" if i == LONG_RUN // 2 else ("w1" if i % 3 else "w2")
        bodies.append((worker, 1, StageReserved(f"st-{i}", 1, Usage(fuel=0, stages=i, reserved_fuel=i))))
    events = [
        RecordedEvent("long", i, epoch, worker, f"s{i}", 1_000 * i, "", body, "")  # type: ignore[arg-type]
        for i, (worker, epoch, body) in enumerate(bodies, start=1)
    ]
    return render_html(build_report("long", events)), len(events)


def test_a_long_run_is_drawn_at_a_bounded_size_and_every_lane_shows_its_events() -> None:
    """Given a 100,000-event run, when drawn, then the page stays small, each lane is a density strip with
    at least one cell (the one-event worker too) and its count, and the table says how many it shows."""
    html, count = long_run_report()
    page = Page(html)
    classes = page.classes()

    assert count == LONG_RUN
    assert len(html.encode()) < 1_000_000
    assert classes["lane"] == 3
    cells = Counter(attrs["data-worker"] for _, attrs in page.elements if "cell" in attrs.get("class", "").split())
    assert set(cells) == {"w1", "w2", "lonely"}
    assert cells["lonely"] == 1
    assert classes["event"] == 2  # the routine reservations are in the strips; the opening and the grant drawn
    assert "1 event" in page.text and "66,666 events" in page.text
    shown = page.by_id("events-shown")
    assert shown[0] == "p"
    assert "Showing 500 of 100,000 events" in "".join(page.text)
    assert classes["gap"] == 1
    plot = next(a for t, a in page.elements if t == "path" and a.get("class") == "usage")
    assert plot["d"].count("H") < 1_300  # the burn-down thinned to about two steps per unit of width


def test_a_long_run_renders_in_headless_chromium_within_three_seconds(
    chromium: str, page: Path, tmp_path: Path
) -> None:
    """Given the 100,000-event report, when Chromium loads it, then it takes under 3 s more than the demo's
    23-event page (the browser's own start-up is not the report's) and draws the strips."""
    html, _ = long_run_report()
    long_page = tmp_path / "long.html"
    long_page.write_text(html, encoding="utf-8")

    def dumped(path: Path) -> tuple[float, Page]:
        started = time.monotonic()
        done = browse(chromium, "--dump-dom", path.as_uri())
        assert done.returncode == 0, done.stderr[-2000:]
        return time.monotonic() - started, Page(done.stdout)

    small, _ = dumped(page)
    large, dom = dumped(long_page)

    assert large - small < 3.0, f"{large:.2f} s against {small:.2f} s for the demo"
    assert dom.classes()["cell"] > 0
    assert dom.by_id("events-shown")[0] == "p"
