"""The benchmark's report of a ratio's uncertainty (bench/append.py): paired rounds, bootstrapped."""

from __future__ import annotations

from bench.append import Row, Sample, paired_ratio_interval


def _sample(rounds: list[tuple[int, float]]) -> Sample:
    total = Sample()
    for events, seconds in rounds:
        total.add(Sample(events, seconds))
    return total


def test_rounds_at_one_ratio_give_that_ratio_as_the_whole_interval() -> None:
    # given twelve rounds in which Baton takes exactly twice raw's time, however fast the host was
    raw = [(1000, 0.01 * (1 + i % 3)) for i in range(12)]
    baton = [(events, 2 * seconds) for events, seconds in raw]
    # when the interval is bootstrapped
    interval = paired_ratio_interval(baton, raw)
    # then it is 0.5 at both ends: host phases that both sides share do not widen it
    assert interval is not None
    assert interval[0] == interval[1] == 0.5


def test_the_interval_holds_the_headline_ratio_and_widens_with_noise() -> None:
    # given rounds whose ratio wanders between 0.45 and 0.60, and rounds that wander less
    raw = [(1000, 0.010)] * 12
    wide = [(1000, 0.010 / r) for r in (0.45, 0.60, 0.50, 0.55, 0.48, 0.58, 0.52, 0.47, 0.59, 0.51, 0.56, 0.49)]
    narrow = [(1000, 0.010 / r) for r in (0.52, 0.53, 0.52, 0.54, 0.53, 0.52, 0.53, 0.54, 0.52, 0.53, 0.53, 0.52)]
    # when each is reported as a row
    wide_row = Row("1000-event batches", "sqlite", _sample(wide), _sample(raw))
    narrow_row = Row("1000-event batches", "sqlite", _sample(narrow), _sample(raw))
    # then each interval is ordered and holds its ratio, and the noisier one is wider
    assert wide_row.interval is not None and narrow_row.interval is not None
    assert wide_row.interval[0] <= wide_row.ratio <= wide_row.interval[1]
    assert narrow_row.interval[0] <= narrow_row.ratio <= narrow_row.interval[1]
    assert wide_row.interval[1] - wide_row.interval[0] > narrow_row.interval[1] - narrow_row.interval[0]


def test_too_few_rounds_give_no_interval() -> None:
    # given a quick run: one round a side
    # when its interval is asked for, then there is none (nothing to resample)
    assert paired_ratio_interval([(1000, 0.02)], [(1000, 0.01)]) is None
    assert Row("x", "sqlite", _sample([(1000, 0.02)]), _sample([(1000, 0.01)]), "goal", 0.5).interval is None


def test_a_miss_whose_interval_reaches_the_goal_names_it_and_a_clear_miss_does_not() -> None:
    # given a goal of 0.5x and two runs below it: one whose rounds straddle the goal, one wholly under
    raw = _sample([(1000, 0.010)] * 12)
    straddling = _sample([(1000, 0.010 / r) for r in (0.45, 0.53, 0.47, 0.52, 0.46, 0.51) * 2])
    under = _sample([(1000, 0.010 / r) for r in (0.40, 0.41, 0.40, 0.42, 0.41, 0.40) * 2])
    # when each is judged
    near = Row("1000-event batches", "sqlite", straddling, raw, ">=0.5x", 0.5).verdict
    clear = Row("1000-event batches", "sqlite", under, raw, ">=0.5x", 0.5).verdict
    # then both are misses, and only the first names the interval that reaches the goal
    assert near.startswith("NOT met (its 95% interval 0.4") and near.endswith("reaches the goal)")
    assert clear == "NOT met"


def test_a_ratio_over_its_goal_is_met_and_a_p99_over_its_bound_is_not() -> None:
    # given twelve rounds at 0.6x against a goal of 0.5x, with appends of 1 ms and then of 4 ms
    raw = Sample()
    fast, slow = Sample(), Sample()
    for _ in range(12):
        raw.add(Sample(100, 0.060, [0.0006] * 100))
        fast.add(Sample(100, 0.100, [0.001] * 100))
        slow.add(Sample(100, 0.100, [0.004] * 100))
    # when each is judged against >= 0.5x and p99 <= 3 ms
    met = Row("single appends, 1 writer", "sqlite", fast, raw, "goal", 0.5, 3.0)
    tail = Row("single appends, 1 writer", "sqlite", slow, raw, "goal", 0.5, 3.0)
    # then the first is met, with an interval of the exact ratio, and the second fails on its p99 alone
    assert met.verdict == "met"
    assert met.interval is not None and round(met.interval[0], 9) == round(met.interval[1], 9) == 0.6
    assert tail.verdict.startswith("NOT met (p99; raw's own 0.60 ms")


def test_a_total_keeps_its_own_figures_as_a_round_when_more_are_added() -> None:
    # given a sample timed in one go, and an empty total
    timed, total = Sample(1000, 0.02), Sample()
    # when another sample is added to each
    timed.add(Sample(1000, 0.03))
    total.add(Sample(1000, 0.03))
    # then the timed one holds both rounds, and the empty total only the one added
    assert timed.rounds == [(1000, 0.02), (1000, 0.03)]
    assert total.rounds == [(1000, 0.03)]
