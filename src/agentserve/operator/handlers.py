"""kopf handlers, thin: every trigger runs `sync`, which applies the children and computes status.

Triggers:
- create / update (spec) / resume of an AgentServingDeployment: sync now (spec edits land in one pass);
- every `RESYNC_SECONDS`, the `Resync` loop (a thread of ours, not a kopf timer): the level-based
  safety net (drift, pod-level status, retries);
- events of the children (labelled `app.kubernetes.io/managed-by=agentserve-operator`): a child
  deleted or edited by hand is put back at once, and the owner's status follows Deployment changes.

The frontends' signing key: unless the spec names a Secret, every sync creates `NAME-signing-key`
with `secrets.token_bytes(32)` when no Secret of that name exists (a create the apiserver refuses for
an existing name, so a key is never overwritten; the operator can create Secrets, never read them). A
Secret deleted by hand comes back at the next sync with a new key.

Children carry an owner reference to the CR, so Kubernetes garbage-collects them when it is deleted:
no finalizer. That is also why the resync is not a kopf timer: kopf puts a finalizer on every resource
a timer or daemon watches (deleting a CR, or its namespace, with the operator down then hangs in
Terminating), and its timers stopped for good after an API-server outage of a minute or more. The
`Resync` loop catches every error and simply tries again at the next tick, so it outlives any outage.

Errors never escape a handler: an invalid spec or a failing API call becomes the `Ready` condition
(reasons `InvalidSpec`, `ReconcileError`) and the resync retries. Outcomes a person wants in
`kubectl describe` (children applied or deleted, the key created, failures, Ready changes) are
posted as Events (`events.py`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from agentserve.keyfile import NEW_KEY_BYTES
from agentserve.operator.build import (
    CHILD_KINDS,
    L_INSTANCE,
    L_MANAGED_BY,
    LWS_API_VERSION,
    LWS_KIND,
    MANAGED_BY,
    REQUIRED_KINDS,
    Target,
    build,
    owned_selector,
    spans_nodes,
)
from agentserve.operator.cluster import Cluster, ClusterError, KindNotInstalled, KubeCluster
from agentserve.operator.events import event_object, outcome_notes
from agentserve.operator.manifests import ManifestError, parse_spec
from agentserve.operator.metrics import OperatorMetrics
from agentserve.operator.multinode import ssh_secret_to_create
from agentserve.operator.reconcile import (
    OPERATOR_CONDITIONS,
    SIGNING_FINGERPRINT_ANNOTATION,
    Failure,
    ObjectRef,
    Plan,
    compute_status,
    group_as_deployment,
    is_subset,
    plan,
    ref,
    signing_secret_to_create,
    stale_conditions,
)
from agentserve.operator.spec import GROUP, KIND, PLURAL, ROOT_RULES, VERSION, AgentServingDeploymentSpec

Logger = logging.Logger | logging.LoggerAdapter[Any]
RESYNC_SECONDS = 30.0
PEERING_LIFETIME_SECONDS = 15
EVENT_DEBOUNCE_SECONDS = 2.0
METRICS_PORT = 8081


@dataclass
class SyncResult:
    status: dict[str, Any]
    plan: Plan = field(default_factory=Plan)
    failure: Failure | None = None
    # Secrets this sync created, with their key's fingerprint (what the frontends will log).
    created: list[tuple[ObjectRef, str]] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # other writers' conditions to remove

    @property
    def ready(self) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True" for c in self.status.get("conditions", []))


def _owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(r.get("uid") == uid and r.get("controller") for r in refs)


def observed_children(
    cluster: Cluster, namespace: str, name: str, missing: set[tuple[str, str]] | None = None
) -> list[dict[str, Any]]:
    """Every object of a child kind labelled as this CR's; kinds the cluster lacks are skipped (and
    added to `missing`)."""
    selector = owned_selector(name)
    objects: list[dict[str, Any]] = []
    for api_version, kind in CHILD_KINDS:
        try:
            objects += cluster.list(api_version, kind, namespace, selector)
        except KindNotInstalled:
            if missing is not None:
                missing.add((api_version, kind))
            continue
    return objects


def _required_missing(desired: list[dict[str, Any]], missing: set[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted({(o["apiVersion"], o["kind"]) for o in desired} & missing & REQUIRED_KINDS)


def _not_installed(desired: list[dict[str, Any]], missing: set[tuple[str, str]]) -> Failure | None:
    """A required kind the spec needs and the cluster lacks: refuse the whole apply (nothing partial)."""
    absent = _required_missing(desired, missing)
    if not absent:
        return None
    api_version, kind = absent[0]
    return Failure(
        f"{kind}NotInstalled",
        f"{kind} ({api_version}) is not installed in this cluster; workers.nodesPerWorker > 1 needs it: "
        "install LeaderWorkerSet (sigs.k8s.io/lws, docs/kubernetes.md) — nothing was applied",
    )


def new_signing_key() -> bytes:
    return secrets.token_bytes(NEW_KEY_BYTES)


def sync(
    cluster: Cluster,
    body: Mapping[str, Any],
    now: datetime | None = None,
    new_key: Callable[[], bytes] = new_signing_key,
) -> SyncResult:
    """One reconcile of the CR `body`: apply what is missing or drifted, prune, compute status."""
    meta = body.get("metadata") or {}
    target = Target(str(meta["name"]), str(meta.get("namespace") or "default"), meta.get("uid"))
    generation = meta.get("generation")
    failure: Failure | None = None
    spec: AgentServingDeploymentSpec | None = None
    actions = Plan()
    created: list[tuple[ObjectRef, str]] = []
    try:
        for rule in ROOT_RULES:
            if not rule.check(target.name):
                raise ManifestError(f"metadata.name: {rule.message}")
        spec = parse_spec(body.get("spec"))
    except ManifestError as exc:
        failure = Failure("InvalidSpec", str(exc))

    if spec is not None:
        try:
            desired = build(spec, target.name, target.namespace, target.uid)
            missing: set[tuple[str, str]] = set()
            observed = observed_children(cluster, target.namespace, target.name, missing)
            for api_version, kind in _required_missing(desired, missing):
                cluster.recheck(api_version)  # installed since it was found missing?
                try:
                    observed += cluster.list(api_version, kind, target.namespace, owned_selector(target.name))
                    missing.discard((api_version, kind))
                except KindNotInstalled:
                    pass
            failure = _not_installed(desired, missing)
            if failure is None:
                # Before the Deployments: new frontend pods wait for the Secret they mount.
                secret = signing_secret_to_create(spec, target, new_key)
                if secret is not None and _create(cluster, secret, "the frontends' signing key"):
                    created.append(
                        (ref(secret), secret["metadata"]["annotations"][SIGNING_FINGERPRINT_ANNOTATION])
                    )
                if spans_nodes(spec):  # the MPI key of the groups' ranks, made once like the signing key
                    ssh = ssh_secret_to_create(target, new_key)
                    if _create(cluster, ssh, "the worker groups' MPI SSH key"):
                        created.append((ref(ssh), "ed25519"))
                actions = plan(desired, observed)
                # Only prune what this CR controls: a labelled object someone else made is left alone.
                actions.delete = [r for r in actions.delete if _owned_by(_find(observed, r), target.uid)]
                for obj in actions.apply:
                    cluster.apply(obj)
                for child in actions.delete:
                    cluster.delete(child)
        except KindNotInstalled as exc:
            failure = Failure("ReconcileError", f"{exc}: install its CRD or disable the feature using it")
        except ClusterError as exc:
            failure = Failure("ReconcileError", str(exc))

    try:
        deployments = cluster.list("apps/v1", "Deployment", target.namespace, owned_selector(target.name))
        deployments += [group_as_deployment(g) for g in _groups(cluster, target)]
        pods = cluster.list("v1", "Pod", target.namespace, owned_selector(target.name))
    except ClusterError as exc:
        deployments, pods = [], []
        failure = failure or Failure("ReconcileError", f"cannot read children: {exc}")
    status = compute_status(
        target=target,
        generation=generation,
        spec=spec,
        deployments=deployments,
        pods=pods,
        previous=body.get("status"),
        failure=failure,
        now=now or datetime.now(UTC),
    )
    return SyncResult(status, actions, failure, created, stale_conditions(spec, body.get("status")))


def _groups(cluster: Cluster, target: Target) -> list[dict[str, Any]]:
    """The CR's LeaderWorkerSets (none where the kind is not installed)."""
    try:
        return cluster.list(LWS_API_VERSION, LWS_KIND, target.namespace, owned_selector(target.name))
    except KindNotInstalled:
        return []


def _create(cluster: Cluster, obj: dict[str, Any], what: str) -> bool:
    try:
        return cluster.create(obj)
    except ClusterError as exc:
        raise ClusterError(f"cannot create {ref(obj)} ({what}): {exc}", exc.status) from exc


def _find(objects: list[dict[str, Any]], key: ObjectRef) -> dict[str, Any]:
    return next(o for o in objects if ref(o) == key)


def owner_of(child: Mapping[str, Any]) -> str | None:
    """The name of the AgentServingDeployment that controls `child`, if any."""
    meta = child.get("metadata") or {}
    for owner in meta.get("ownerReferences") or []:
        if (
            owner.get("kind") == KIND
            and owner.get("apiVersion", "").startswith(f"{GROUP}/")
            and owner.get("controller")
        ):
            return str(owner["name"])
    labels = meta.get("labels") or {}
    if labels.get(L_MANAGED_BY) == MANAGED_BY and labels.get(L_INSTANCE):
        return str(labels[L_INSTANCE])
    return None


# ------------------------------------------------------------------------------------ the operator


class State:
    """What the handlers share (kept in kopf's memo): the client, locks, debounce marks, metrics."""

    def __init__(self, cluster: Cluster, metrics: OperatorMetrics | None = None) -> None:
        self.cluster = cluster
        self.metrics = metrics or OperatorMetrics()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()
        self.last_sync: dict[tuple[str, str], float] = {}

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())


def run_sync(state: State, body: Mapping[str, Any], trigger: str, logger: Logger) -> SyncResult:
    """`sync` under the CR's lock, with logging and metrics; never raises."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
    started = time.monotonic()
    with state.lock(namespace, name):
        try:
            result = sync(state.cluster, body)
        except Exception as exc:  # an operator bug must not crash-loop: report it as a condition
            logger.exception("reconcile of %s/%s failed", namespace, name)
            failure = Failure("ReconcileError", f"internal error: {type(exc).__name__}: {exc}")
            result = SyncResult(
                compute_status(
                    target=Target(name, namespace, meta.get("uid")),
                    generation=meta.get("generation"),
                    spec=None,
                    deployments=[],
                    pods=[],
                    previous=body.get("status"),
                    failure=failure,
                    now=datetime.now(UTC),
                ),
                failure=failure,
            )
        state.last_sync[(namespace, name)] = time.monotonic()
    where = f"{namespace}/{name}"
    for secret, key_fingerprint in result.created:
        logger.info("%s: created %s with a new signing key (fingerprint %s)", where, secret, key_fingerprint)
    for obj in result.plan.apply:
        logger.info("%s: applied %s/%s", where, obj["kind"], obj["metadata"]["name"])
    for child in result.plan.delete:
        logger.info("%s: deleted %s", where, child)
    if result.failure is not None:
        logger.warning("%s: %s: %s", where, result.failure.reason, result.failure.message)
    post_events(state.cluster, Target(name, namespace, meta.get("uid")), body.get("status"), result, logger)
    state.metrics.record(
        trigger=trigger,
        result=result.failure.reason if result.failure else "ok",
        seconds=time.monotonic() - started,
        applied=[o["kind"] for o in result.plan.apply] + [r.kind for r, _ in result.created],
        deleted=[r.kind for r in result.plan.delete],
        namespace=namespace,
        name=name,
        ready=result.ready,
    )
    return result


def post_events(
    cluster: Cluster,
    target: Target,
    previous_status: Mapping[str, Any] | None,
    result: SyncResult,
    logger: Logger,
) -> None:
    """Events for this sync's outcomes; a failure to post one is logged, never raised."""
    notes = outcome_notes(
        applied=[f"{o['kind']}/{o['metadata']['name']}" for o in result.plan.apply],
        deleted=[str(r) for r in result.plan.delete],
        created=[str(r) for r, _ in result.created],
        previous_status=previous_status,
        status=result.status,
    )
    now = datetime.now(UTC)
    for note in notes:
        try:
            cluster.post_event(event_object(target, note, now))
        except ClusterError as exc:
            logger.debug("%s/%s: cannot post event %s: %s", target.namespace, target.name, note.reason, exc)


def write_status(cluster: Cluster, owner: Mapping[str, Any], result: SyncResult) -> None:
    """Apply the sync's status where it says something the CR's does not, and remove the conditions
    it found stale (raises ClusterError)."""
    meta = owner.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    if status_changed(owner, result.status):
        cluster.patch_status(namespace, name, result.status)
    for condition in result.stale:
        cluster.remove_condition(namespace, name, condition)


def status_changed(body: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether `status` says anything the CR's stored status does not (no write at rest). Conditions
    are compared by type (a list-map): another writer's condition beside ours is no change, one of
    ours the stored list has and `status` no longer does is."""
    stored = dict(body.get("status") or {})
    ours = dict(status)
    mine = ours.pop("conditions", None) or []
    held = {c.get("type"): c for c in stored.pop("conditions", None) or []}
    if not is_subset(ours, stored):
        return True
    if any(not is_subset(c, held.get(c.get("type"))) for c in mine):
        return True
    wanted = {c.get("type") for c in mine}
    return any(kind in OPERATOR_CONDITIONS and kind not in wanted for kind in held)


def on_child_event(
    state: State, event_type: str | None, child: Mapping[str, Any], logger: Logger
) -> SyncResult | None:
    """A child changed: re-sync its owner (at once when deleted, else debounced) and patch status."""
    if event_type is None:  # the initial listing: resume handlers cover start-up
        return None
    owner_name = owner_of(child)
    namespace = (child.get("metadata") or {}).get("namespace")
    if owner_name is None or not namespace:
        return None
    last = state.last_sync.get((namespace, owner_name))
    if event_type != "DELETED" and last is not None and time.monotonic() - last < EVENT_DEBOUNCE_SECONDS:
        return None
    try:
        owner = state.cluster.get_owner(namespace, owner_name)
    except ClusterError as exc:
        logger.warning("cannot read AgentServingDeployment %s/%s: %s", namespace, owner_name, exc)
        return None
    if owner is None or (owner.get("metadata") or {}).get("deletionTimestamp"):
        return None
    result = run_sync(state, owner, f"child-{event_type.lower()}", logger)
    try:
        write_status(state.cluster, owner, result)
    except ClusterError as exc:
        logger.warning("cannot write status of %s/%s: %s", namespace, owner_name, exc)
    return result


class Resync:
    """The level-based safety net: every `interval` seconds, list the CRs and sync each one.

    A thread of ours rather than a kopf timer (see the module docstring: no finalizer, survives
    outages). Every error is caught and logged; the loop only ends with `stop()`. Status is written
    only when it changed. With several operator replicas, each runs it: a sync writes only on drift,
    with one field manager and the same desired state, so replicas never fight.
    """

    def __init__(
        self, state: State, namespaces: list[str], logger: Logger, interval: float = RESYNC_SECONDS
    ) -> None:
        self.state = state
        self.namespaces = namespaces
        self.logger = logger
        self.interval = interval
        self.rounds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> int:
        """One pass over every CR; returns how many were synced."""
        try:
            owners = self.state.cluster.list_owners(self.namespaces)
        except ClusterError as exc:
            self.logger.warning("resync: cannot list AgentServingDeployments (%s); retrying", exc)
            return 0
        synced = 0
        for owner in owners:
            meta = owner.get("metadata") or {}
            if meta.get("deletionTimestamp") or self._stop.is_set():
                continue
            result = run_sync(self.state, owner, "timer", self.logger)
            synced += 1
            try:
                write_status(self.state.cluster, owner, result)
            except ClusterError as exc:
                self.logger.warning(
                    "resync: cannot write status of %s/%s: %s", meta.get("namespace"), meta.get("name"), exc
                )
        return synced

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except Exception:  # a bug in one pass must not end the safety net
                self.logger.exception("resync pass failed")
            self.rounds += 1

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="agentserve-resync", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def ensure_crd(cluster: Cluster, logger: Logger) -> bool:
    """Server-side apply this operator version's CRD (`--manage-crd`): Helm installs a chart's crds/
    only when missing and never upgrades them, so the operator keeps the schema it needs current.
    A failure (e.g. RBAC without patch on the CRD) is logged; the operator still runs."""
    from agentserve.operator.crd import crd

    try:
        cluster.apply(crd())
    except ClusterError as exc:
        logger.warning("cannot apply the AgentServingDeployment CRD (--manage-crd): %s", exc)
        return False
    logger.info("applied the AgentServingDeployment CRD of this operator version")
    return True


def _state(memo: Any) -> State:
    state = getattr(memo, "agentserve", None)
    if state is None:
        state = State(KubeCluster())
        memo.agentserve = state
    assert isinstance(state, State)
    return state


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Logger, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = 8
    if getattr(memo, "peering", None):
        # High availability: replicas elect one active operator through kopf's peering object. A
        # missing peering CRD or object is an error, not a silent standalone; a replica killed
        # without a goodbye is replaced after `lifetime` seconds (one that stops cleanly, at once).
        settings.peering.mandatory = True
        settings.peering.lifetime = int(getattr(memo, "peering_lifetime", PEERING_LIFETIME_SECONDS))
        settings.peering.stealth = True
    state = _state(memo)
    if getattr(memo, "manage_crd", False):
        ensure_crd(state.cluster, logger)
    namespaces = list(getattr(memo, "namespaces", None) or [])
    interval = float(getattr(memo, "resync_seconds", RESYNC_SECONDS))
    memo.resync = Resync(state, namespaces, logging.getLogger("agentserve.operator.resync"), interval)
    memo.resync.start()
    port = int(getattr(memo, "metrics_port", METRICS_PORT))
    if port:
        memo.metrics_runner = await _serve_metrics(state.metrics, port)
        logger.info("metrics on :%d/metrics", port)


async def _serve_metrics(metrics: OperatorMetrics, port: int) -> Any:
    from aiohttp import web

    async def handle(_: web.Request) -> web.Response:
        return web.Response(text=metrics.render(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner


@kopf.on.cleanup()
async def stop_metrics(memo: kopf.Memo, **_: Any) -> None:
    resync = getattr(memo, "resync", None)
    if resync is not None:
        resync.stop()
    runner = getattr(memo, "metrics_runner", None)
    if runner is not None:
        await runner.cleanup()


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile(body: kopf.Body, memo: kopf.Memo, logger: Logger, **_: Any) -> None:
    state = _state(memo)
    result = run_sync(state, body, "spec", logger)
    # Server-side apply, not kopf's merge patch: that replaces the whole condition list, dropping a
    # condition the planner wrote after this body was read. A failed write raises: kopf retries.
    write_status(state.cluster, body, result)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def forget(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    # optional=True: no finalizer; children go by garbage collection (owner references).
    state = _state(memo)
    state.metrics.forget(str(body.metadata.namespace), str(body.metadata.name))


_CHILD_RESOURCES = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("networking.k8s.io", "v1", "networkpolicies"),
)


def _register_child_watch(group: str, version: str, plural: str) -> None:
    def child_event(body: kopf.Body, type: str | None, memo: kopf.Memo, logger: Logger, **_: Any) -> None:
        on_child_event(_state(memo), type, body, logger)

    child_event.__name__ = f"child_{plural}"
    kopf.on.event(group, version, plural, labels={L_MANAGED_BY: MANAGED_BY}, id=f"child-{plural}")(
        child_event
    )


for _group, _version, _plural in _CHILD_RESOURCES:
    _register_child_watch(_group, _version, _plural)


def run_operator(
    *,
    namespaces: list[str],
    liveness: str | None,
    metrics_port: int = METRICS_PORT,
    verbose: bool = False,
    manage_crd: bool = False,
    resync_seconds: float = RESYNC_SECONDS,
    peering: str | None = None,
    peering_lifetime: int = PEERING_LIFETIME_SECONDS,
) -> int:
    """`agentserve operator`: run kopf in this process. Without `peering` it runs standalone (one
    replica); with it, replicas share kopf's peering object `peering` and one of them is active
    (each replica draws a distinct random priority: kopf pauses every peer on a tie)."""
    kopf.configure(verbose=verbose)
    memo = kopf.Memo(
        metrics_port=metrics_port,
        namespaces=namespaces,
        manage_crd=manage_crd,
        resync_seconds=resync_seconds,
        peering=peering,
        peering_lifetime=peering_lifetime,
    )
    kopf.run(
        standalone=not peering,
        peering_name=peering or None,
        priority=secrets.randbelow(2**31 - 1) + 1 if peering else None,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness or None,
        memo=memo,
    )
    return 0
