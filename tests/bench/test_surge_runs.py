"""How ``bench/scaling.py`` picks the static allocation its measured ratio is against."""

from __future__ import annotations

from bench._surge_runs import best_static_behind


def run(behind: float | None, rows_per_core_second: float) -> dict:
    return {"trainer_starvation_behind": behind, "rows_per_core_second": rows_per_core_second}


def test_the_best_static_count_that_starves_no_more_than_the_scaled_run():
    scaled = run(0.156, 6_100.0)
    statics = {1: run(0.55, 10_470.0), 2: run(0.227, 5_220.0), 3: run(0.198, 3_470.0), 4: run(0.028, 2_600.0)}
    assert best_static_behind(scaled, statics)[:2] == (4, round(6_100 / 2_600, 4))
    statics[3] = run(0.15, 3_470.0)  # now 3 starves no more either, with more rows per core-second
    assert best_static_behind(scaled, statics)[:2] == (3, round(6_100 / 3_470, 4))


def test_where_every_static_count_starves_more_the_least_starved_gives_a_lower_bound():
    # a run of 2026-12-05: the scaled run waited 0.1436 behind Kafka, static 4 (the most) 0.1475
    scaled = run(0.1436, 6_448.0)
    statics = {1: run(0.5876, 10_470.1), 2: run(0.276, 5_220.4), 3: run(0.2255, 3_470.5), 4: run(0.1475, 2_599.3)}
    best, ratio, basis = best_static_behind(scaled, statics)
    assert (best, ratio) == (4, round(6_448 / 2_599.3, 4)) and "lower bound" in basis
    assert best_static_behind(run(None, 6_448.0), statics)[:2] == (None, None)
