"""``baton handoff export|import|status`` and ``baton gate``: the handoff protocol from a shell.

``export`` prepares the handoff in the source store (the lease moves there) and writes the document
to stdout with its digest on stderr; ``import`` accepts it in the destination store (importing the
run when that store has never seen it). Both are idempotent: after a lost reply, run the same
command again, or ask ``status``: the store is the only source of truth. ``state`` prints the
migrated state a store accepted, from its own blob store (generation zero).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import click

from baton.adapters import handoff as protocol
from baton.adapters.bootstrap import open_ledger
from baton.adapters.cli.app import Failed, bad_file, unknown_run
from baton.adapters.cli.identity import read_key
from baton.adapters.cli.options import echo_json, json_option, placement_options, store_option
from baton.adapters.handoff_state import accepted_state
from baton.domain.commands import Verdict
from baton.domain.events import Placement

__all__ = ["COMMANDS"]

RUN_ID = click.argument("run_id", metavar="RUN_ID")
READABLE = click.Path(exists=True, dir_okay=False, path_type=Path)
TTL_MS = click.option("--ttl-ms", type=int, default=30_000, show_default=True, help="the destination's first lease")


KEY = click.option(
    "--key", "key_file", metavar="FILE", help="sign with this private key (the submitting worker's), for a signed store"
)


@click.group("handoff")
def handoff() -> None:
    """Hand a run to another worker, store or region."""


@handoff.command("export")
@RUN_ID
@click.option("--to", "worker", required=True, metavar="WORKER", help="the destination worker")
@click.option("--state", required=True, type=READABLE, metavar="FILE", help="the task state the last checkpoint sealed")
@click.option("--to-version", type=int, default=None, help="migrate the state to this schema version")
@click.option(
    "--to-store", metavar="STORE_ID", help="the store the run moves to (`baton store id` there), across stores"
)
@placement_options(worker="worker")
@TTL_MS
@KEY
@store_option
def export(
    run_id: str,
    state: Path,
    to_version: int | None,
    to_store: str | None,
    placement: Placement,
    ttl_ms: int,
    key_file: str | None,
    store: str | None,
) -> int:
    """Prepare a handoff; the document goes to stdout, its digest to stderr."""
    try:
        task_state: dict[str, Any] = json.loads(state.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_file(state, exc) from None
    if not isinstance(task_state, dict):
        raise Failed(f"{state} holds JSON but not an object: the task state is one JSON object")
    key = read_key(key_file) if key_file else None
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        prepared = protocol.prepare(
            ledger,
            run_id,
            destination=placement,
            state=task_state,
            to_version=to_version,
            to_store=to_store,
            ttl_ms=ttl_ms,
            key=key,
        )
    if prepared.verdict.verdict == "rejected":
        click.echo(f"handoff refused ({prepared.verdict.reason}): {prepared.verdict.message}", err=True)
        return 1
    click.echo(prepared.document, nl=False)
    click.echo(prepared.digest, err=True)
    return 0


@handoff.command("import")
@click.argument("document", type=READABLE, metavar="DOCUMENT")
@click.option("--expect-digest", required=True, metavar="DIGEST", help="the document's digest, from a trusted channel")
@click.option("--receipt", type=READABLE, metavar="FILE", help="the source's claim receipt (`baton handoff claim`)")
@click.option("--trust", metavar="PUBLIC_KEY", default="", help="the source store's public key (store id there)")
@TTL_MS
@KEY
@store_option
def import_(
    document: Path,
    expect_digest: str,
    receipt: Path | None,
    trust: str,
    ttl_ms: int,
    key_file: str | None,
    store: str | None,
) -> int:
    """Accept a handoff document: in this store, or importing the run with the source's claim receipt.

    Prints one JSON verdict line, refusals included (the document is not parsed before its digest
    is the expected one). Exit 1 if refused.
    """
    data = document.read_bytes()
    claim = receipt.read_text(encoding="utf-8").strip() if receipt is not None else ""
    key = read_key(key_file) if key_file else None
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        verdict = protocol.accept(ledger, data, expect_digest, ttl_ms=ttl_ms, key=key, receipt=claim, trust=trust)
    echo_json(verdict)
    return 1 if verdict.verdict == "rejected" else 0


@handoff.command("claim")
@RUN_ID
@click.option("--digest", required=True, metavar="DIGEST", help="the prepared handoff's document digest")
@click.option("--for-store", required=True, metavar="STORE_ID", help="the store the run moves to")
@KEY
@store_option
def claim(run_id: str, digest: str, for_store: str, key_file: str | None, store: str | None) -> int:
    """In the source store: claim the handoff for one store; prints the receipt it signs.

    The claim is recorded once: the same call again prints the same receipt; a claim for another
    store, and an abort after a claim, are refused (already_claimed). Exit 1 if refused.
    """
    key = read_key(key_file) if key_file else None
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        answer = protocol.claim(ledger, run_id, digest, for_store, key=key)
    echo_json(answer)
    return 1 if isinstance(answer, Verdict) else 0


@handoff.command("confirm")
@RUN_ID
@click.option("--digest", required=True, metavar="DIGEST", help="the claimed handoff's document digest")
@click.option("--position", required=True, type=int, help="the position the destination imported it at")
@KEY
@store_option
def confirm(run_id: str, digest: str, position: int, key_file: str | None, store: str | None) -> int:
    """In the source store: record that the destination imported the claimed handoff. Exit 1 if refused."""
    key = read_key(key_file) if key_file else None
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        verdict = protocol.confirm(ledger, run_id, digest, position, key=key)
    echo_json(verdict)
    return 1 if verdict.verdict == "rejected" else 0


@handoff.command("status")
@RUN_ID
@store_option
def status(run_id: str, store: str | None) -> int:
    """What the store says about a run's handoffs.

    Exit 1 if the store has never seen the run.
    """
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        found = protocol.status(ledger, run_id)
    if not found.exists:
        raise unknown_run(run_id)
    echo_json(found)
    return 0


@handoff.command("state")
@RUN_ID
@store_option
def state_(run_id: str, store: str | None) -> int:
    """Print the migrated state exactly as this store accepted it (canonical JSON, from its blob store).

    Its digest (state_digest_of) is the document's state_digest. Exit 1 if the run has no accepted
    handoff here.
    """
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        accepted = accepted_state(ledger, run_id)
    click.echo(accepted.data, nl=False)
    return 0


@click.command("gate")
@RUN_ID
@click.option("--worker", required=True, help="the worker asking")
@click.option("--epoch", required=True, type=int, help="the epoch the worker believes it holds")
@click.option("--op", metavar="OP_ID", help="the operation it wants to perform")
@click.option("--key", "idempotency_key", metavar="KEY", help="or: the idempotency key its intent gave the system")
@json_option
@store_option
def gate(
    run_id: str, worker: str, epoch: int, op: str | None, idempotency_key: str | None, as_json: bool, store: str | None
) -> int:
    """May worker W at epoch E perform operation O (or the one holding idempotency key K) now?

    Exactly one of --op and --key. Exit 0 if allowed, 1 if denied.
    """
    if (op is None) == (idempotency_key is None):
        raise click.UsageError("give exactly one of --op and --key")
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        if op is not None:
            decision = protocol.gate(ledger, run_id, worker, epoch, op)
        else:
            assert idempotency_key is not None
            decision = protocol.gate_key(ledger, run_id, worker, epoch, idempotency_key)
    if as_json:
        echo_json(decision)
    else:
        click.echo(f"{'allowed' if decision.allowed else 'denied'} ({decision.reason}): {decision.detail}")
    return 0 if decision.allowed else 1


COMMANDS = (handoff, gate)
