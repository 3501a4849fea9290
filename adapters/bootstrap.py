"""The composition root: the only place that turns settings into concrete adapters."""

from __future__ import annotations

import uuid

from eventsourcing.persistence import InfrastructureFactory
from eventsourcing.utils import Environment

from baton.adapters.clock import Clock
from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.blobs import SqlConnection
from baton.adapters.eventstore.reachability import check_reachable, first_contact
from baton.adapters.eventstore.store_identity import StoreIdentity
from baton.adapters.identity import SigningKey
from baton.adapters.langgraph.index import create_index_tables
from baton.adapters.settings import StoreSettings
from baton.adapters.views import DEFAULT_BATCH, PostgresViews, SQLiteViews, ViewRunner
from baton.domain.commands import Command, OpenRegistry, Submission, Verdict
from baton.domain.errors import BatonError
from baton.domain.identity import REGISTRY_RUN

__all__ = ["init_store", "open_ledger", "open_views", "register", "store_identity"]

# a long-running process checks its store once at start: as patient as the liveness session's connect
PREFLIGHT_TIMEOUT_S = 5


def open_ledger(url: str | None = None, *, clock: Clock | None = None, one_shot: bool = False) -> RunLedger:
    """A ledger on an initialised store. It never changes the schema: a store that lacks a migration
    (or has none) is refused here with ``SchemaNotReady``, which names ``baton store init``; one that
    cannot be reached, with ``StoreUnreachable``, which says why.

    ``one_shot`` (a CLI command) opens one PostgreSQL connection and never more: a short-lived
    process gains nothing from a pool. It waits briefly for that connection and diagnoses only a
    failure, so a healthy store costs it no extra connection. A long-running process keeps the
    pool's long wait (requests queue for a busy connection under load) and checks the store with one
    direct connection up front instead, which it pays once in its life.
    """
    settings = StoreSettings.resolve(url)
    if not one_shot:
        check_reachable(settings, timeout=PREFLIGHT_TIMEOUT_S)
    env = settings.env(create_table=False, one_shot=one_shot)
    return first_contact(settings, lambda: _schema_checked(RunLedger(env, clock=clock)))


def _schema_checked(ledger: RunLedger) -> RunLedger:
    try:
        ledger.store.check_schema()
    except BaseException:
        ledger.close()
        raise
    return ledger


def init_store(
    url: str | None = None,
    *,
    operator_key: SigningKey | None = None,
    operator: str = "operator",
    unsigned: bool = False,
) -> StoreSettings:
    """Bring the store's schema to the latest version: apply the migrations it lacks, in order, each
    recorded in ``baton_migrations``; a store made before versions were recorded is recognised.

    With ``operator_key``, also open the store's principal registry with ``operator`` as its first
    operator: from then on the store accepts only signed submissions (``domain.identity``). With
    ``unsigned``, open it as a development store that verifies no identities. With neither, a
    store without a registry stays one (identities not verified). A registry, once open, is never
    opened again: both are no-ops then. Idempotent.
    """
    if operator_key is not None and unsigned:
        raise ValueError("a store is either signed (operator_key) or unsigned, not both")
    settings = StoreSettings.resolve(url)
    env = settings.env(create_table=False, one_shot=True)
    ledger = first_contact(settings, lambda: RunLedger(env))  # the pool connects as the ledger is built
    try:
        ledger.store.migrate()
        if operator_key is not None or unsigned:
            _open_registry(ledger, operator_key, operator)
    finally:
        ledger.close()
    side = SqlConnection(settings.url, pool_size=1)  # the LangGraph thread index, outside the versioned schema
    try:
        create_index_tables(side)
    finally:
        side.close()
    return settings


def store_identity(url: str | None = None) -> StoreIdentity:
    """The store's identity, made by the ``baton store init`` that created its schema: the id and
    public key others know it by (``baton store id``), and the key it tags snapshots with."""
    ledger = open_ledger(url, one_shot=True)
    try:
        return ledger.identity()
    finally:
        ledger.close()


def register(url: str | None, operator_key: SigningKey, command: Command) -> Verdict:
    """Submit a registry command (add a principal, change its roles, revoke it) signed by an operator.

    The submission names the principal whose key ``operator_key`` is; the ledger checks it is an
    operator's."""
    ledger = open_ledger(url, one_shot=True)
    try:
        registry = ledger.state(REGISTRY_RUN)
        if not registry.opened:
            raise BatonError("this store has no registry: run `baton store init --operator-key FILE` first")
        name = registry.principal_keys.get(operator_key.public_key, "")
        submission = Submission(f"{name or 'unknown'}:{uuid.uuid4().hex}", REGISTRY_RUN, name or "unknown", command)
        return ledger.submit(operator_key.sign(submission))
    finally:
        ledger.close()


def _open_registry(ledger: RunLedger, key: SigningKey | None, operator: str) -> None:
    """Open the registry once; asked again, say so unless it is already what was asked for."""
    registry = ledger.state(REGISTRY_RUN)
    if registry.opened:
        if key is None and registry.signatures_required:
            raise BatonError("this store verifies identities already: it cannot become an unsigned store")
        if key is not None and not registry.signatures_required:
            raise BatonError("this store was opened unsigned: its registry cannot start verifying identities")
        if key is not None and key.public_key not in registry.principal_keys:
            raise BatonError("this store's registry was opened with another operator key")
        return
    # the runs already in the store, and how far: their events up to there were never signed
    existing = {row.run_id: row.head for row in ledger.runs() if row.run_id != REGISTRY_RUN}
    command = OpenRegistry(key is not None, key.public_key if key else "", existing)
    submission = Submission(f"{operator}:open-registry", REGISTRY_RUN, operator, command)
    verdict = ledger.open_registry(key.sign(submission) if key is not None else submission)
    if verdict.verdict == "rejected":
        raise BatonError(f"could not open the registry: {verdict.reason}: {verdict.message}")


def open_views(url: str | None = None, *, batch_size: int = DEFAULT_BATCH) -> ViewRunner:
    """The view runner on the store's own database: the ledger's log in, view tables out.

    Creates the view tables if missing (idempotent; start one runner first if several start at
    once). Tracking lives in the library's tracking table (``batonviews_tracking`` in
    PostgreSQL, ``tracking`` in SQLite), keyed by the ledger's name.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    settings = StoreSettings.resolve(url)
    ledger = open_ledger(url)
    env = settings.env(create_table=True)
    env.pop("APPLICATION_RECORDER_TOPIC")
    factory = InfrastructureFactory.construct(Environment("BatonViews", env))
    try:
        store = factory.tracking_recorder(PostgresViews if settings.backend == "postgresql" else SQLiteViews)
        assert isinstance(store, PostgresViews | SQLiteViews)
    except BaseException:
        ledger.close()
        raise
    return ViewRunner(
        store,
        ledger,
        upstream=ledger.name,
        batch_size=batch_size,
        total=lambda: sum(row.head for row in ledger.runs()),
        on_close=ledger.close,
    )
