"""Kubernetes Events for reconcile outcomes, pure: what `kubectl describe asd NAME` should show.

kopf posts no Events for our log lines (its `posting` of loggers is off by default), so the operator
writes core/v1 Events itself, for the outcomes a person wants to see: children applied or deleted
(drift repaired, spec followed), the signing key created, an invalid spec or a failing API call, and
the CR becoming Ready or not. A failure repeated by every resync is posted once: only when the `Ready`
condition's reason or message changes, read from the previous status, so no state is kept here.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from agentserve.operator.build import MANAGED_BY, Target
from agentserve.operator.spec import API_VERSION, KIND

EventType = Literal["Normal", "Warning"]
MAX_MESSAGE = 1024  # the apiserver refuses Event messages over 1 KiB (core/v1 validation)
MAX_LISTED = 8  # object names listed in one message; the rest are counted


@dataclass(frozen=True)
class Note:
    type: EventType
    reason: str
    message: str


def _ready(status: Mapping[str, Any] | None) -> Mapping[str, Any]:
    for condition in (status or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return dict(condition)
    return {}


def _listing(verb: str, names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return f"{verb} {shown}{more}"


def outcome_notes(
    *,
    applied: Sequence[str],
    deleted: Sequence[str],
    created: Sequence[str],
    previous_status: Mapping[str, Any] | None,
    status: Mapping[str, Any],
) -> list[Note]:
    """The Events one sync deserves, in the order they happened (object names as `Kind/name`)."""
    notes: list[Note] = []
    if created:
        notes.append(Note("Normal", "Created", _listing("created", created)))
    if applied:
        notes.append(Note("Normal", "Applied", _listing("applied", applied)))
    if deleted:
        notes.append(Note("Normal", "Deleted", _listing("deleted", deleted)))
    before, now = _ready(previous_status), _ready(status)
    changed = (before.get("status"), before.get("reason"), before.get("message")) != (
        now.get("status"),
        now.get("reason"),
        now.get("message"),
    )
    if now and changed:
        if now.get("status") == "True":
            notes.append(Note("Normal", "Ready", str(now.get("message") or "all components ready")))
        else:
            reason = str(now.get("reason") or "NotReady")
            warning = reason in ("InvalidSpec", "ReconcileError") or before.get("status") == "True"
            notes.append(Note("Warning" if warning else "Normal", reason, str(now.get("message") or reason)))
    return notes


def event_object(target: Target, note: Note, now: datetime) -> dict[str, Any]:
    """A core/v1 Event about the CR `target` (a generated name: the apiserver picks a unique one)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    message = note.message if len(note.message) <= MAX_MESSAGE else note.message[: MAX_MESSAGE - 1] + "…"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{target.name}.", "namespace": target.namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": target.name,
            "namespace": target.namespace,
            **({"uid": target.uid} if target.uid else {}),
        },
        "type": note.type,
        "reason": note.reason,
        "message": message,
        "source": {"component": MANAGED_BY, "host": socket.gethostname()[:253]},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
