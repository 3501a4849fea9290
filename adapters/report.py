"""``baton report RUN_ID -o run.html``: one run as one self-contained HTML page.

The page fetches nothing (inline CSS and inline SVG, no fonts, no scripts; a Content-Security-Policy
forbids any fetch): a timeline of the run's events in one lane per worker with the semantic stages
as bands, each epoch change, lease takeover and handoff marked; the budget burn-down of every
counter against its ceiling; the audit's verdict; and the events as a table. The model is
``projections.report`` (pure); this module only draws it, escaping everything that comes from the log.
The command is ``adapters/cli/audit.py``.

A long run is drawn at a bounded size, so a 100,000-event run stays a page a browser opens at once:
past ``MARK_LIMIT`` events each lane becomes a density strip (events per column, darker where
busier) with only the notable events drawn one by one (lease grants and ends, transitions,
checkpoints, authority, handoffs, the run's ends, whatever the audit names), the burn-down plots
keep the last value per pixel column, and the event table shows the first and last rows and every
row the audit names, saying how many of how many it shows.
"""

from __future__ import annotations

import datetime as dt
import math
from html import escape

from baton.domain.stages import Stage
from baton.projections.report import BudgetSeries, Mark, RunReport

__all__ = ["render_html"]

WIDTH, LEFT, RIGHT = 1320, 130, 20  # the timeline's viewBox width and margins
TOP, LANE, AXIS = 48, 46, 30  # stage-label and epoch rows above the lanes; lane height; axis below
PLOT_W, PLOT_H, PLOT_PAD = 300, 120, 26
STAGE_COLOURS = ("#e8f0fe", "#fdf1d8", "#f3e5f5", "#e0f2f1", "#fff3e0", "#ede7f6", "#fce4ec", "#e8f5e9", "#dcedc8")
LABELS = {"cost_micros": "cost (micros)"}
MARK_LIMIT = 2_000  # past this many events the lanes are density strips (module docstring)
NOTABLE_LIMIT = 1_000  # notable events drawn one by one in a density timeline, at most
COLUMNS = 600  # density columns across the timeline
TABLE_ENDS = 250  # rows at each end of a long event table
PLOT_POINTS = 2 * PLOT_W  # burn-down steps kept per plot: two per horizontal unit
ROUTINE = frozenset({"StageReserved", "IntentRecorded", "ObservationRecorded", "LeaseRenewed"})

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px 32px;color:#1d2430}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 8px}h3{font-size:13px;margin:0 0 2px}
.meta{color:#5a6472}.meta code{color:#1d2430}
.verdict{border-radius:6px;padding:8px 12px;margin:12px 0;border:1px solid}
.verdict.ok{background:#e8f5e9;border-color:#66bb6a}.verdict.problems{background:#ffebee;border-color:#e53935}
.verdict strong{font-size:15px}
svg text{font:11px system-ui,sans-serif;fill:#1d2430}
.lane-line{stroke:#c9d1dc}.lane-label{font-weight:600}
.stage-label{font-size:10px;fill:#455064}.epoch-label{font-size:10px;font-weight:600}
.epoch-segment{fill:#eef1f5}.epoch-segment.odd{fill:#dfe5ee}
.epoch-change{stroke:#37474f;stroke-width:1.5;stroke-dasharray:5 3}
.takeover path{stroke:#e65100;stroke-width:2;fill:none}.takeover text{fill:#e65100;font-weight:600}
.handoff-link{stroke:#6a1b9a;stroke-width:2;fill:none;stroke-dasharray:2 2}
.event{stroke:#fff;stroke-width:1}.event.problem{stroke:#d50000;stroke-width:3}
.density rect{fill:#1e88e5}.lane-count{font-size:10px;fill:#5a6472}
.k-life{fill:#37474f}.k-lease{fill:#ef6c00}.k-operation{fill:#1e88e5}.k-stage{fill:#43a047}
.k-checkpoint{fill:#00897b}.k-authority{fill:#8e24aa}.k-handoff{fill:#6a1b9a}
.axis line{stroke:#9aa5b4}.axis text{fill:#5a6472;font-size:10px}
.legend{display:flex;flex-wrap:wrap;gap:4px 18px;padding:0;margin:6px 0 0;list-style:none;color:#374151;font-size:12px}
.legend svg{vertical-align:middle}.legend .note{flex-basis:100%}
.budget-plots{display:grid;grid-template-columns:repeat(4,minmax(0,1fr));gap:10px 16px}
.budget{border:1px solid #e1e6ed;border-radius:6px;padding:6px 8px}.budget .used{color:#5a6472;font-size:12px}
.budget-plot .usage{stroke:#1e88e5;stroke-width:2;fill:none}.budget-plot .area{fill:#e3f2fd}
.budget-plot .ceiling{stroke:#d50000;stroke-width:1.5;stroke-dasharray:6 3}.budget-plot .frame{stroke:#c9d1dc}
.budget.over{border-color:#d50000}
table{border-collapse:collapse;font-size:12px}th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #e6eaf0}
td.num{text-align:right;font-variant-numeric:tabular-nums}tr.problem td{background:#fff3f3}
"""


def _iso(micros: int) -> str:
    return dt.datetime.fromtimestamp(micros / 1e6, tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _n(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


class _Scale:
    """Positions 1..head onto ``[left, right]``: each event has a cell, its mark at the cell's centre."""

    def __init__(self, head: int, left: float, right: float) -> None:
        self.left, self.step = left, (right - left) / max(head, 1)

    def edge(self, position: float) -> float:
        return self.left + (position - 1) * self.step

    def x(self, position: float) -> float:
        return self.edge(position) + self.step / 2


def _ticks(head: int) -> range:
    raw = max(1, math.ceil(head / 20))
    nice = next((m * 10**e for e in range(19) for m in (1, 2, 5) if m * 10**e >= raw), raw)
    return range(nice if nice > 1 else 1, head + 1, nice)


# -- the timeline -------------------------------------------------------------------------------


class _Frame:
    """Where things go on the timeline: one lane per worker, positions along x."""

    def __init__(self, report: RunReport) -> None:
        self.report = report
        self.lanes = {worker: TOP + i * LANE + LANE / 2 for i, worker in enumerate(report.workers)}
        self.bottom = TOP + len(self.lanes) * LANE
        self.scale = _Scale(report.head, LEFT, WIDTH - RIGHT)


def _timeline(report: RunReport) -> str:
    frame = _Frame(report)
    return (
        f'<svg id="timeline" class="timeline" viewBox="0 0 {WIDTH} {frame.bottom + AXIS}" width="100%" role="img" '
        f'aria-label="timeline of run {_e(report.run_id)}">{DEFS}{_bands(frame)}{_epoch_strip(frame)}{_lanes(frame)}'
        f"{_epoch_changes(frame)}{_handoff_links(frame)}{_marks(frame)}{_axis(frame)}</svg>"
    )


DEFS = "".join(
    f'<marker id="arrow-{name}" viewBox="0 0 10 10" refX="8" refY="5" markerWidth="7" markerHeight="7" '
    f'orient="auto"><path d="M0 0L10 5L0 10z" fill="{colour}"/></marker>'
    for name, colour in (("takeover", "#e65100"), ("handoff", "#6a1b9a"))
).join(("<defs>", "</defs>"))


def _bands(frame: _Frame) -> str:
    """The stages as shaded bands; the labels on two alternating rows, drawn over every band."""
    order, scale = list(Stage), frame.scale
    rects, labels = [], []
    for i, band in enumerate(frame.report.bands):
        known = band.stage in order
        colour = STAGE_COLOURS[order.index(Stage(band.stage)) % len(STAGE_COLOURS)] if known else "#eeeeee"
        x0, x1 = scale.edge(band.first), scale.edge(band.last + 1)
        rects.append(
            f'<g class="stage-band" data-stage="{_e(band.stage)}"><title>{_e(band.stage)}: positions '
            f'{band.first}-{band.last}</title><rect x="{_n(x0)}" y="2" width="{_n(x1 - x0)}" '
            f'height="{_n(frame.bottom - 2)}" fill="{colour}"/></g>'
        )
        labels.append(
            f'<text class="stage-label" x="{_n((x0 + x1) / 2)}" y="{13 if i % 2 == 0 else 25}" '
            f'text-anchor="middle">{_e(band.stage)}</text>'
        )
    return f'<g class="stage-bands">{"".join(rects)}{"".join(labels)}</g>'


def _epoch_strip(frame: _Frame) -> str:
    report, scale = frame.report, frame.scale
    first = report.marks[0] if report.marks else None
    starts = [(first.position, first.epoch)] if first else []
    starts += [(c.position, c.epoch) for c in report.epochs]
    out = []
    for i, (position, epoch) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else report.head + 1
        x0, x1 = scale.edge(position), scale.edge(end)
        out.append(
            f'<rect class="epoch-segment{" odd" if i % 2 else ""}" x="{_n(x0)}" y="30" width="{_n(max(x1 - x0, 0))}" '
            f'height="14"/><text class="epoch-label" x="{_n(x0 + 4)}" y="41">epoch {epoch}</text>'
        )
    return f'<g class="epochs">{"".join(out)}</g>'


def _lanes(frame: _Frame) -> str:
    """One lane per worker, labelled with its name and how many of the run's events it appended."""
    counts = dict.fromkeys(frame.lanes, 0)
    for mark in frame.report.marks:
        counts[mark.worker] += 1
    return "".join(
        f'<g class="lane" data-worker="{_e(worker)}"><line class="lane-line" x1="{LEFT}" y1="{_n(y)}" '
        f'x2="{WIDTH - RIGHT}" y2="{_n(y)}"/><text class="lane-label" x="8" y="{_n(y)}">{_e(_clip(worker))}'
        f'<title>{_e(worker)}</title></text><text class="lane-count" x="8" y="{_n(y + 12)}">'
        f"{_count(counts[worker], 'event')}</text></g>"
        for worker, y in frame.lanes.items()
    )


def _clip(text: str, width: int = 18) -> str:
    """A lane label that fits left of the lanes (the whole name is the label's tooltip)."""
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _epoch_changes(frame: _Frame) -> str:
    """A dashed line where each epoch starts; an arrow between the lanes where it was a lease takeover."""
    out = []
    for change in frame.report.epochs:
        x = frame.scale.edge(change.position)
        title = (
            f"epoch {change.epoch} from position {change.position}: {change.how}. From here an append at an "
            f"older epoch is refused (stale_epoch) and stores nothing."
        )
        out.append(
            f'<g class="epoch-change-mark" data-epoch="{change.epoch}"><title>{_e(title)}</title>'
            f'<line class="epoch-change" x1="{_n(x)}" y1="30" x2="{_n(x)}" y2="{frame.bottom}"/></g>'
        )
        y0, y1 = frame.lanes.get(change.previous_worker), frame.lanes.get(change.worker)
        if change.takeover and y0 is not None and y1 is not None:
            out.append(
                f'<g class="takeover"><title>{_e(change.how)}: {_e(change.worker)} took epoch {change.epoch}</title>'
                f'<path d="M{_n(x - 6)} {_n(y0)} L{_n(x + 6)} {_n(y1 - 8 if y1 > y0 else y1 + 8)}" '
                f'marker-end="url(#arrow-takeover)"/><text x="{_n(x + 6)}" y="{frame.bottom - 4}">takeover</text></g>'
            )
    return "".join(out)


def _handoff_links(frame: _Frame) -> str:
    """A dotted arrow from each HandoffPrepared to the HandoffAccepted of the same document."""
    by_position = {m.position: m for m in frame.report.marks}
    prepared = {h.document_digest: h for h in frame.report.handoffs if h.step == "prepared"}
    out = []
    for handoff in frame.report.handoffs:
        source = prepared.get(handoff.document_digest) if handoff.step == "accepted" else None
        start = by_position.get(source.position) if source else None
        end = by_position.get(handoff.position)
        if start is None or end is None:
            continue
        x0, x1 = frame.scale.x(start.position), frame.scale.x(end.position)
        y0, y1 = frame.lanes[start.worker], frame.lanes[end.worker]
        middle = _n((y0 + y1) / 2)
        out.append(
            f'<path class="handoff-link" d="M{_n(x0)} {_n(y0)} C{_n(x0)} {middle} {_n(x1)} {middle} {_n(x1)} '
            f'{_n(y1 + (-9 if y1 > y0 else 9))}" marker-end="url(#arrow-handoff)"><title>handoff of document '
            f"{_e(handoff.document_digest)}</title></path>"
        )
    return "".join(out)


def _marks(frame: _Frame) -> str:
    marks = frame.report.marks
    if len(marks) <= MARK_LIMIT:
        radius = max(2.5, min(7.0, frame.scale.step / 2.6))
        drawn = "".join(_mark(m, frame.scale.x(m.position), frame.lanes[m.worker], radius) for m in marks)
        return f'<g class="events">{drawn}</g>'
    notable = _notable(marks)
    drawn = "".join(_mark(m, frame.scale.x(m.position), frame.lanes[m.worker], 4.0) for m in notable)
    return f'{_density(frame)}<g class="events" data-drawn="{len(notable)}">{drawn}</g>'


def _notable(marks: tuple[Mark, ...]) -> list[Mark]:
    """The events a long timeline still draws one by one: what the audit names first, then the rest in order."""
    named = [m for m in marks if m.problems]
    rest = [m for m in marks if m.type not in ROUTINE and not m.problems]
    return sorted(named[:NOTABLE_LIMIT] + rest[: max(NOTABLE_LIMIT - len(named), 0)], key=lambda m: m.position)


def _density(frame: _Frame) -> str:
    """Each lane as ``COLUMNS`` cells: a cell's height and shade grow with the events it holds, and a cell
    with any event is drawn, so a worker with a single event among a hundred thousand still shows."""
    head = max(frame.report.head, 1)
    cells: dict[str, list[int]] = {worker: [0] * COLUMNS for worker in frame.lanes}
    for mark in frame.report.marks:
        cells[mark.worker][min((mark.position - 1) * COLUMNS // head, COLUMNS - 1)] += 1
    busiest = max((max(row) for row in cells.values()), default=1) or 1
    width = (WIDTH - RIGHT - LEFT) / COLUMNS
    out = []
    for worker, row in cells.items():
        y = frame.lanes[worker]
        lane = _e(worker)
        for column, count in enumerate(row):
            if count:
                share = math.sqrt(count / busiest)  # a few events stay visible beside the busiest cell
                half = 3 + 13 * share
                out.append(
                    f'<rect class="cell" data-worker="{lane}" x="{_n(LEFT + column * width)}" y="{_n(y - half)}" '
                    f'width="{_n(max(width, 1))}" height="{_n(2 * half)}" fill-opacity="{0.35 + 0.65 * share:.2f}">'
                    f"<title>{count:,} events of {lane}</title></rect>"
                )
    return f'<g class="density" data-columns="{COLUMNS}">{"".join(out)}</g>'


def _axis(frame: _Frame) -> str:
    y = frame.bottom + 4
    out = [f'<g class="axis"><line x1="{LEFT}" y1="{y}" x2="{WIDTH - RIGHT}" y2="{y}"/>']
    for tick in _ticks(frame.report.head):
        x = _n(frame.scale.x(tick))
        out.append(
            f'<line x1="{x}" y1="{y}" x2="{x}" y2="{y + 4}"/>'
            f'<text x="{x}" y="{y + 15}" text-anchor="middle">{tick}</text>'
        )
    out.append(f'<text x="8" y="{y + 15}">position</text></g>')
    return "".join(out)


def _mark(mark: Mark, x: float, y: float, radius: float) -> str:
    problem = " problem" if mark.problems else ""
    title = f"#{mark.position} {mark.type}, {mark.worker} at epoch {mark.epoch}, {_iso(mark.recorded_at)}"
    title += f"\n{mark.summary}" if mark.summary else ""
    title += f"\naudit: {', '.join(mark.problems)}" if mark.problems else ""
    classes = f"event k-{mark.kind}{problem}"
    data = f'data-position="{mark.position}" data-type="{_e(mark.type)}"'
    if mark.kind == "handoff":  # a diamond, so handoffs stand out from the run's work
        r = radius * 1.35
        shape = (
            f'<path class="{classes} handoff-{_e(mark.type.removeprefix("Handoff").lower())}" {data} '
            f'd="M{_n(x)} {_n(y - r)}L{_n(x + r)} {_n(y)}L{_n(x)} {_n(y + r)}L{_n(x - r)} {_n(y)}z">'
        )
        return f"{shape}<title>{_e(title)}</title></path>"
    circle = f'<circle class="{classes}" {data} cx="{_n(x)}" cy="{_n(y)}" r="{_n(radius)}">'
    return f"{circle}<title>{_e(title)}</title></circle>"


def _legend() -> str:
    def dot(kind: str) -> str:
        return f'<svg width="12" height="12"><circle class="k-{kind}" cx="6" cy="6" r="5"/></svg>'

    items = [
        f"<li>{dot('life')} run opened / ended</li>",
        f"<li>{dot('lease')} lease</li>",
        f"<li>{dot('operation')} intent, observation, reconciliation, reservation</li>",
        f"<li>{dot('stage')} stage transition</li>",
        f"<li>{dot('checkpoint')} checkpoint</li>",
        f"<li>{dot('authority')} authority, approval, evidence</li>",
        '<li><svg width="14" height="14"><path class="k-handoff" d="M7 1L13 7L7 13L1 7z"/></svg> handoff '
        "(prepared, accepted, aborted; dotted arrow: prepared to accepted)</li>",
        '<li><svg width="14" height="12"><circle cx="6" cy="6" r="4" fill="#fff" stroke="#d50000" stroke-width="3"/>'
        "</svg> an event the audit names</li>",
        "<li>shaded bands: the run's semantic stage</li>",
        '<li><svg width="16" height="12"><path d="M2 11L14 1" stroke="#e65100" stroke-width="2"/></svg> '
        "lease takeover after the holder's lease expired</li>",
        '<li class="note" id="stale-note"><svg width="14" height="14"><line x1="7" y1="0" x2="7" y2="14" '
        'stroke="#37474f" stroke-width="1.5" stroke-dasharray="4 2"/></svg> <strong>epoch change.</strong> '
        "Rejected stale appends are never stored in the log (a refused append stores nothing), so the "
        "report cannot show them as events: each dashed line marks where a new epoch starts, from where "
        "any append at an older epoch is refused (<code>stale_epoch</code>).</li>",
    ]
    return f'<ul class="legend" id="legend">{"".join(items)}</ul>'


# -- budgets, verdict, events -------------------------------------------------------------------


def _budget(series: BudgetSeries, head: int) -> str:
    ceiling = series.ceiling
    top = max(series.used, ceiling or 0, 1)
    scale = _Scale(head, PLOT_PAD + 14, PLOT_W - 8)
    y0, y1 = PLOT_H - 16, 8

    def y(value: int) -> float:
        return y0 - (y0 - y1) * value / top

    path = f"M{_n(scale.edge(series.points[0][0]) if series.points else scale.left)} {_n(y(0))}"
    for position, value in _thinned(series.points, head):
        path += f"H{_n(scale.x(position))}V{_n(y(value))}"
    path += f"H{_n(scale.edge(head + 1))}"
    area = f"{path}V{_n(y0)}H{_n(scale.left)}z"
    over = ceiling is not None and series.used > ceiling
    name = LABELS.get(series.counter, series.counter.replace("_", " "))
    limit = f" of {ceiling:,}" if ceiling is not None else " (no ceiling)"
    parts = [
        f'<div class="budget{" over" if over else ""}" id="budget-{_e(series.counter)}">',
        f'<h3>{_e(name)}</h3><div class="used">used {series.used:,}{limit}</div>',
        f'<svg class="budget-plot" data-counter="{_e(series.counter)}" viewBox="0 0 {PLOT_W} {PLOT_H}" width="100%">',
        f'<path class="frame" d="M{_n(scale.left)} {y1}V{y0}H{PLOT_W - 8}" fill="none"/>',
        f'<path class="area" d="{area}"/><path class="usage" d="{path}"/>',
        f'<text x="{_n(scale.left - 4)}" y="{y0 + 3}" text-anchor="end">0</text>',
        f'<text x="{_n(scale.left - 4)}" y="{y1 + 8}" text-anchor="end">{_e(_compact(top))}</text>',
        f'<text x="{_n(scale.left)}" y="{PLOT_H - 3}">1</text>',
        f'<text x="{PLOT_W - 8}" y="{PLOT_H - 3}" text-anchor="end">{head}</text>',
    ]
    if ceiling is not None:
        parts.append(
            f'<line class="ceiling" x1="{_n(scale.left)}" y1="{_n(y(ceiling))}" x2="{PLOT_W - 8}" '
            f'y2="{_n(y(ceiling))}"><title>ceiling {ceiling:,}</title></line>'
        )
    parts.append("</svg></div>")
    return "".join(parts)


def _thinned(points: tuple[tuple[int, int], ...], head: int) -> tuple[tuple[int, int], ...]:
    """At most about ``PLOT_POINTS`` steps: the last value in each column, so the end and any crossing stay."""
    if len(points) <= PLOT_POINTS:
        return points
    kept: dict[int, tuple[int, int]] = {}
    for point in points:
        kept[point[0] * PLOT_POINTS // max(head, 1)] = point
    return tuple(kept.values())


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n:,} {noun}s"


def _compact(value: int) -> str:
    for size, suffix in ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "k")):
        if value >= size:
            return f"{value / size:.3g}{suffix}"
    return str(value)


def _verdict(report: RunReport) -> str:
    if report.ok:
        return (
            '<section id="verdict" class="verdict ok"><strong>Audit: ok.</strong> Chain, digests, fencing, '
            f"operations, budgets, stages, handoffs and authority hold over all {report.head} events "
            "(<code>baton audit</code>).</section>"
        )
    rows = "".join(
        f'<tr class="problem"><td class="num">{p.position}</td><td><code>{_e(p.code)}</code></td>'
        f"<td>{_e(p.detail)}</td></tr>"
        for p in report.problems
    )
    return (
        f'<section id="verdict" class="verdict problems"><strong>Audit: {len(report.problems)} problem'
        f"{'s' if len(report.problems) != 1 else ''}.</strong> The first is the damage; the ones after it may "
        f"follow from it (<code>baton audit</code>, docs/audit.md)."
        f'<table id="problems"><tr><th>position</th><th>code</th><th>detail</th></tr>{rows}</table></section>'
    )


def _events(report: RunReport) -> str:
    marks = report.marks
    shown = list(marks)
    note = ""
    if len(marks) > 2 * TABLE_ENDS:
        middle = [m for m in marks[TABLE_ENDS:-TABLE_ENDS] if m.problems][:TABLE_ENDS]
        shown = [*marks[:TABLE_ENDS], *middle, *marks[-TABLE_ENDS:]]
        note = (
            f'<p id="events-shown" class="meta">Showing {len(shown):,} of {len(marks):,} events: the first and '
            f"last {TABLE_ENDS}, and {_count(len(middle), 'event')} between them that the audit names. "
            f"<code>baton history {_e(report.run_id)}</code> lists them all.</p>"
        )
    rows = []
    for i, m in enumerate(shown):
        if i and m.position != shown[i - 1].position + 1:
            gap = m.position - shown[i - 1].position - 1
            rows.append(f'<tr class="gap"><td colspan="7">\u2026 {gap:,} events not shown \u2026</td></tr>')
        rows.append(
            f'<tr{" class=problem" if m.problems else ""}><td class="num">{m.position}</td>'
            f"<td>{_e(_iso(m.recorded_at))}</td><td>{_e(m.type)}</td><td>{_e(m.worker)}</td>"
            f"<td class=num>{m.epoch}</td><td>{_e(m.summary)}</td><td>{_e(', '.join(m.problems))}</td></tr>"
        )
    return (
        f'{note}<table id="events"><tr><th>pos</th><th>recorded (UTC)</th><th>event</th><th>worker</th>'
        f"<th>epoch</th><th>detail</th><th>audit</th></tr>{''.join(rows)}</table>"
    )


def render_html(report: RunReport) -> str:
    """The whole page: no external resource of any kind."""
    span = (report.last_at - report.first_at) / 1e6
    handoffs = sum(h.step == "accepted" for h in report.handoffs)
    takeovers = sum(c.takeover for c in report.epochs)
    budgets = "".join(_budget(series, report.head) for series in report.budgets)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        f'<meta name="viewport" content="width=device-width"><title>Baton run {_e(report.run_id)}</title>'
        f"<style>{CSS}</style></head><body>"
        f'<header id="summary"><h1>Run <code>{_e(report.run_id)}</code></h1><div class="meta">'
        f"{_e(report.status)} at <code>{_e(report.stage)}</code>; {report.head} events from "
        f"{_e(_iso(report.first_at))} over {span:.0f} s; {_count(len(report.workers), 'worker')}, "
        f"{_count(len(report.epochs), 'epoch change')}, {_count(takeovers, 'lease takeover')}, "
        f"{_count(handoffs, 'handoff')} accepted</div></header>"
        f"{_verdict(report)}"
        f'<section id="timeline-section"><h2>Timeline by worker and epoch</h2>{_timeline(report)}{_legend()}</section>'
        f'<section id="budgets"><h2>Budget burn-down per counter (usage over position; dashed: the ceiling)</h2>'
        f'<div class="budget-plots">{budgets}</div></section>'
        f'<section id="events-section"><h2>Events</h2>{_events(report)}</section>'
        "</body></html>\n"
    )
