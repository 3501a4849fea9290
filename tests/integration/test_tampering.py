"""Tampering behind the ledger's back: altered or deleted rows must fail ``verify`` at the right position.

The attacker here has database access: it disables the append-only trigger (Postgres) or drops it
(SQLite) and edits ``stored_events`` / ``batonledger_events`` directly.

What counts as a change: each digest is computed over the canonical form of the *decoded* JSON
(``domain.chain.verify_chain``), not over the stored bytes. So re-formatting a stored envelope
(whitespace, key order) is not a semantic change and still verifies, and it decodes to the same
event; changing any value is a semantic change and breaks the chain at that position.
"""

from __future__ import annotations

import json

import msgspec
import pytest
from integration_support import T0, LedgerFactory, RawStore, Submitter, intent, open_run

from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger
from baton.domain.chain import envelope_digest
from baton.domain.commands import RecordObservation, RecordTransition
from baton.domain.decide import context_digest
from baton.domain.errors import ChainBroken
from baton.domain.stages import Stage

RUN = "audited"


def short_run(ledger: RunLedger) -> None:
    """Given five valid events: opened, leased, intent (n=7), observation (x=1), transition."""
    assert open_run(ledger, RUN).position == 1
    worker = Submitter(ledger, RUN, "A")
    worker.acquire()
    command = intent("op-1", kind="effect", n=7)
    worker.submit(command)
    worker.submit(RecordObservation("op-1", context_digest(command.context), "ok", result={"x": 1}))
    assert worker.submit(RecordTransition(Stage.CANDIDATE_READY, "sha256:" + "cd" * 32)).position == 5
    assert ledger.verify(RUN).events == 5


def force_update(store: RawStore, position: int, state: bytes, *, run_id: str = RUN) -> None:
    """Overwrite one stored envelope, bypassing the append-only trigger."""
    update = (
        f"UPDATE {store.events_table} SET state = ? WHERE originator_id = ? AND originator_version = ?",
        (state, run_id, position),
    )
    if store.backend == "sqlite":
        store.execute("DROP TRIGGER stored_events_no_update", update)
    else:
        toggle = "ALTER TABLE batonledger_events {} TRIGGER baton_append_only"
        store.execute(toggle.format("DISABLE"), update, toggle.format("ENABLE"))


def force_delete(store: RawStore, position: int) -> None:
    """Delete one stored envelope, bypassing the append-only trigger."""
    delete = (
        f"DELETE FROM {store.events_table} WHERE originator_id = ? AND originator_version = ?",
        (RUN, position),
    )
    if store.backend == "sqlite":
        store.execute("DROP TRIGGER stored_events_no_delete", delete)
    else:
        toggle = "ALTER TABLE batonledger_events {} TRIGGER baton_append_only"
        store.execute(toggle.format("DISABLE"), delete, toggle.format("ENABLE"))


def replace_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, f"{old!r} should occur exactly once in {data!r}"
    return data.replace(old, new)


@pytest.mark.parametrize(
    ("position", "old", "new"),
    [
        (3, b'"n":7', b'"n":8'),  # the arguments an intent was recorded with
        (3, b'"worker":"A"', b'"worker":"M"'),  # who wrote it
        (3, b'"kind":"effect"', b'"kind":"pure"'),  # an effect passed off as pure
        (4, b'"x":1', b'"x":2'),  # the observed result a replay would return
        (4, b'"outcome":"ok"', b'"outcome":"failed"'),
    ],
)
def test_altered_value_is_detected_at_its_position(
    ledgers: LedgerFactory, store: RawStore, position: int, old: bytes, new: bytes
) -> None:
    """Given a valid run, when one value of a stored event is altered in the database, then verify fails there."""
    ledger = ledgers(ManualClock(T0))
    short_run(ledger)

    force_update(store, position, replace_once(store.state_bytes(RUN, position), old, new))

    with pytest.raises(ChainBroken) as broken:
        ledgers().verify(RUN)
    assert broken.value.position == position
    assert "digest mismatch" in broken.value.message


def test_altered_event_with_a_recomputed_digest_breaks_the_next_link(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given an attacker who also re-seals the altered event's own digest, when verified, then the next link fails."""
    ledger = ledgers(ManualClock(T0))
    short_run(ledger)
    envelope = json.loads(store.state_bytes(RUN, 3))
    envelope["body"]["context"]["arguments"]["n"] = 8
    del envelope["digest"]
    envelope["digest"] = envelope_digest(envelope)

    force_update(store, 3, json.dumps(envelope).encode())

    with pytest.raises(ChainBroken) as broken:
        ledgers().verify(RUN)
    assert broken.value.position == 4
    assert "prev_digest" in broken.value.message


def test_deleted_middle_event_is_detected_at_the_gap(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a valid run, when its third event is deleted in the database, then verify fails at position 3."""
    ledger = ledgers(ManualClock(T0))
    short_run(ledger)

    force_delete(store, 3)

    with pytest.raises(ChainBroken) as broken:
        ledgers().verify(RUN)
    assert broken.value.position == 3
    assert "gap" in broken.value.message


@pytest.mark.parametrize("reformat", ["indented", "keys_sorted"])
def test_reformatting_without_changing_values_still_verifies(
    ledgers: LedgerFactory, store: RawStore, reformat: str
) -> None:
    """Given an event re-encoded with other whitespace or key order, when verified, then it passes, decoding alike."""
    ledger = ledgers(ManualClock(T0))
    short_run(ledger)
    before = list(ledger.history(RUN))
    original = store.state_bytes(RUN, 3)
    decoded = json.loads(original)
    reencoded = json.dumps(decoded, indent=2) if reformat == "indented" else json.dumps(decoded, sort_keys=True)
    assert reencoded.encode() != original

    force_update(store, 3, reencoded.encode())

    assert store.state_bytes(RUN, 3) != original
    fresh = ledgers()
    assert fresh.verify(RUN).events == 5  # a formatting-only difference is not a semantic change
    assert list(fresh.history(RUN)) == before


def test_changing_an_integer_into_a_numeric_string_is_detected(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given an observed result {x: 1}, when the stored value is changed to the string '1', then verify fails at 4."""
    ledger = ledgers(ManualClock(T0))
    short_run(ledger)

    force_update(store, 4, replace_once(store.state_bytes(RUN, 4), b'"x":1', b'"x":"1"'))

    fresh = ledgers()
    assert msgspec.structs.asdict(list(fresh.history(RUN))[3].body)["result"] == {"x": "1"}  # what a replay gets
    with pytest.raises(ChainBroken) as broken:
        fresh.verify(RUN)
    assert broken.value.position == 4


def test_deleted_last_event_is_detected(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a valid run of five events, when the last one is deleted, then verify fails at position 5."""
    ledger = ledgers(ManualClock(T0))
    short_run(ledger)

    force_delete(store, 5)

    fresh = ledgers()
    assert fresh.runs()[0].head == 5
    with pytest.raises(ChainBroken) as broken:
        fresh.verify(RUN)
    assert broken.value.position == 5
