"""Snapshots are a cache, never evidence, as a user sees it: `baton resume` and `baton audit` on a store whose
snapshot was altered in the database; `baton store id`."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import msgspec
import psycopg
import pytest
from test_cli import OPEN, baton, lines

from baton.domain.decide import context_digest
from baton.domain.events import IntentContext
from baton.projections.portable_state import PortableStateFold

OPERATIONS = 50  # settled intents, two events each: with open and acquire, 102 events, enough for a snapshot
TAG_BYTES = 32  # the HMAC-SHA256 tag in front of a snapshot's fold bytes (adapters/eventstore/snapshots.py)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'baton.db'}"
    else:
        yield request.getfixturevalue("postgres_url")


def submissions() -> str:
    """A run "r" of 102 events: open, acquire, then OPERATIONS settled pure intents."""
    rows = [
        {"submission_id": "s-open", "run_id": "r", "worker": "w1", "command": OPEN},
        {"submission_id": "s-lease", "run_id": "r", "worker": "w1", "command": lease()},
    ]
    for n in range(OPERATIONS):
        context = IntentContext(turn=n, operation=f"op-{n}")
        intent = {"type": "record_intent", "op_id": f"op-{n}", "kind": "pure", "tool_contract": "t@1"}
        intent |= {"context": msgspec.to_builtins(context), "idempotency_key": f"k-{n}"}
        observed = {"type": "record_observation", "op_id": f"op-{n}", "context_digest": context_digest(context)}
        observed |= {"outcome": "ok", "result": {"n": n}}
        for kind, command in (("i", intent), ("o", observed)):
            envelope = {"submission_id": f"s-{kind}{n}", "run_id": "r", "worker": "w1", "epoch": 1}
            rows.append(envelope | {"command": command})
    return "".join(json.dumps(row) + "\n" for row in rows)


def lease() -> dict[str, object]:
    return {"type": "acquire_lease", "placement": {"worker": "w1"}, "ttl_ms": 3_600_000}


def tamper(store: str, cwd: Path) -> int:
    """Re-encode the run's one snapshot as the ledger would, with holder "mallory" and no calls, behind its old
    tag (no one without the store's key can make a valid one); the snapshot's position."""
    table = "stored_snapshots" if store.startswith("sqlite") else "batonledger_snapshots"
    select = f"SELECT originator_version, state FROM {table} WHERE originator_id = 'r'"
    update = f"UPDATE {table} SET state = %s WHERE originator_id = 'r' AND originator_version = %s"
    connection = (
        sqlite3.connect(cwd / "baton.db") if store.startswith("sqlite") else psycopg.connect(store, autocommit=True)
    )
    with connection as conn:
        ((position, stored),) = conn.execute(select).fetchall()
        fold = PortableStateFold.from_bytes(bytes(stored)[TAG_BYTES:])
        assert fold.run.lease is not None
        fold.run.lease = msgspec.structs.replace(fold.run.lease, worker="mallory")
        fold.run.usage = msgspec.structs.replace(fold.run.usage, calls=0)
        forged = bytes(stored)[:TAG_BYTES] + fold.to_bytes()
        conn.execute(update.replace("%s", "?") if store.startswith("sqlite") else update, (forged, position))
    return int(position)


def test_a_tampered_snapshot_changes_nothing_resume_reports_and_the_audit_names_it(tmp_path: Path, store: str) -> None:
    """Given a run whose snapshot (written by `baton resume`) was re-encoded in the database with owner "mallory"
    and 0 calls, when resumed, then the answer is exactly `--no-snapshots`' and a warning names run and position;
    when audited, then exit 1 with snapshot_mismatch at that position (before tampering: ok)."""
    assert baton(tmp_path, "store", "init", "--store", store, "--unsigned").returncode == 0
    verdicts = lines(baton(tmp_path, "submit", "--store", store, stdin=submissions()).stdout)
    assert [v["verdict"] for v in verdicts] == ["accepted"] * (2 + 2 * OPERATIONS)
    resume = ("resume", "r", "--worker", "w2", "--tool-contract", "t@1", "--json", "--store", store)
    assert baton(tmp_path, *resume).returncode == 0  # folds 102 events: writes a snapshot at the head
    assert baton(tmp_path, "audit", "r", "--store", store).returncode == 0

    position = tamper(store, tmp_path)
    tampered = baton(tmp_path, *resume)
    scratch = baton(tmp_path, *resume, "--no-snapshots")

    assert tampered.returncode == scratch.returncode == 0
    assert tampered.stdout == scratch.stdout
    checkpoint = json.loads(tampered.stdout)["checkpoint"]
    assert (checkpoint["owner"], checkpoint["usage"]["calls"], position) == ("w1", OPERATIONS, 2 + 2 * OPERATIONS)
    assert f"snapshot of run 'r' at position {position} ignored" in tampered.stderr
    audit = baton(tmp_path, "audit", "r", "--json", "--store", store)
    assert audit.returncode == 4, audit.stdout + audit.stderr
    problems = json.loads(audit.stdout)["problems"]
    assert [(p["run_id"], p["position"], p["code"]) for p in problems] == [("r", position, "snapshot_mismatch")]


def test_store_id_prints_the_id_and_public_key_made_at_init(tmp_path: Path) -> None:
    """Given an initialised store, when `baton store id` runs (twice, as JSON and as text), then the same id and
    Ed25519 public key each time and never the private key; an uninitialised store exits 3."""
    store = f"sqlite:///{tmp_path / 'baton.db'}"
    assert baton(tmp_path, "store", "init", "--store", store, "--unsigned").returncode == 0

    as_json = baton(tmp_path, "store", "id", "--store", store, "--json")
    as_text = baton(tmp_path, "store", "id", "--store", store)
    missing = baton(tmp_path, "store", "id", "--store", f"sqlite:///{tmp_path / 'none.db'}")

    assert as_json.returncode == as_text.returncode == 0, as_json.stderr + as_text.stderr
    identity = json.loads(as_json.stdout)
    assert set(identity) == {"store_id", "public_key"}
    assert identity["store_id"].startswith("store-") and identity["public_key"].startswith("ed25519:")
    assert as_text.stdout.split() == ["store", "id", identity["store_id"], "public", "key", identity["public_key"]]
    assert (missing.returncode, "baton store init" in missing.stderr) == (3, True)
