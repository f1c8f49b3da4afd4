"""The series and label names a PromQL expression uses, for checking them against the catalog.

Not an evaluator (promtool evaluates, tests/ops): a tokenizer that finds the metric names (identifiers
that are neither functions, keywords nor label names) and the label names (left of a matcher's
operator, in `by`/`without`/`on`/`ignoring`/`group_left`/`group_right` lists).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_RANGE = re.compile(r"\[[^\]]*\]")
_MATCHERS = re.compile(r"\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENT = re.compile(r"(?<![\w$.])([A-Za-z_:][A-Za-z0-9_:]*)(?!\w)(\s*\()?")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
)
_KEYWORDS |= {"inf", "nan", "Inf", "NaN"}


@dataclass(frozen=True, slots=True)
class Names:
    metrics: frozenset[str]
    labels: frozenset[str]


def names(expr: str) -> Names:
    """The metric and label names `expr` refers to."""
    text = _STRING.sub('""', expr)
    text = _RANGE.sub("", text)
    labels: set[str] = set()
    for block in _MATCHERS.findall(text):
        labels.update(_MATCHER_LABEL.findall(block))
    text = _MATCHERS.sub(" ", text)
    for group in _GROUPING.findall(text):
        labels.update(label.strip() for label in group.split(",") if label.strip())
    text = _GROUPING.sub(" ", text)
    metrics = {
        ident
        for ident, call in _IDENT.findall(text)
        if not call and ident not in _KEYWORDS and not re.fullmatch(r"[0-9].*", ident)
    }
    return Names(frozenset(metrics), frozenset(labels))


def unknown(expr: str, exported: Mapping[str, frozenset[str]]) -> list[str]:
    """What `expr` names that no component exports: `metric NAME` or `label NAME` entries."""
    found = names(expr)
    problems = [f"metric {m}" for m in sorted(found.metrics) if m not in exported]
    known_labels: set[str] = set()
    for metric in found.metrics:
        known_labels |= exported.get(metric, frozenset())
    problems += [f"label {label}" for label in sorted(found.labels) if label not in known_labels]
    if not found.metrics:
        problems.append("no metric at all")
    return problems
