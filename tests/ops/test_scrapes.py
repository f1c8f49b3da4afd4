"""The scrape → promtool input series conversion the panel test relies on."""

from __future__ import annotations

from scrapes import Target, input_series

BEFORE = """# HELP c_total A counter.
# TYPE c_total counter
c_total{a="x"} 1.0
c_created{a="x"} 1.7e9
# HELP g A gauge.
# TYPE g gauge
g 3.0
"""
AFTER = """# HELP c_total A counter.
# TYPE c_total counter
c_total{a="x"} 4.0
c_total{a="y"} 2.0
# HELP g A gauge.
# TYPE g gauge
g 5.0
# HELP h A gauge seen late.
# TYPE h gauge
h 1.0
"""


def test_counters_start_at_zero_gauges_have_gaps_and_up_follows_the_scrapes() -> None:
    target = Target({"pod": "p", "job": "j"}, [BEFORE, AFTER, None])
    series = {s["series"]: s["values"] for s in input_series([target])}
    assert series == {
        'c_total{a="x", job="j", pod="p"}': "1.0 4.0 _",
        'c_total{a="y", job="j", pod="p"}': "0 2.0 _",
        'g{job="j", pod="p"}': "3.0 5.0 _",
        'h{job="j", pod="p"}': "_ 1.0 _",
        'up{job="j", pod="p"}': "1 1 0",
    }
