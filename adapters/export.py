"""Exports: the stored events as canonical JSON Lines, ending in a head statement the store signs.

``write_export`` writes each stream up to the head its run row records (the registry's first, so
an export of a signed store carries its authors' keys), then the statement (``domain.export_head``)
signed with the store's own Ed25519 key: the heads come from the run rows, not from the events
read, so a store whose log lost its tail writes an export that fails its own statement.
``check_statement`` is verify-export's side: the signature (with the trusted key, or at least
with the key the statement names) and each stream's end against its stated head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import IO, Literal, NamedTuple

import msgspec

from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.audit_reader import stored_rows
from baton.adapters.eventstore.store_identity import raw_public_key, store_id_of, verify_store_signature
from baton.domain.canonical import canonical_bytes
from baton.domain.errors import BatonError, RunNotFound
from baton.domain.export_head import HeadStatement, StreamHead, signed_bytes, statement_line
from baton.domain.identity import REGISTRY_RUN
from baton.projections.audit import Problem
from baton.projections.audit_anchors import stated_heads

__all__ = ["StatementCheck", "check_statement", "write_export"]

_generic = msgspec.json.Decoder()
_statement = msgspec.json.Decoder(HeadStatement, strict=False)  # integers are decimal strings

Status = Literal["verified", "unchecked", "missing", "invalid"]


def write_export(
    ledger: RunLedger, run_id: str | None, open_output: Callable[[], contextlib.AbstractContextManager[IO[bytes]]]
) -> HeadStatement:
    """Write one run (or, with None, every run of the store) and the signed head statement to the
    output ``open_output`` opens; return the statement.

    Refused before the output is opened when the run is unknown or the store's key cannot be read
    (this role may not read ``baton_store``): an export the store does not vouch for would prove
    nothing about its tail.
    """
    identity = ledger.store.select_store_identity()
    if identity is None:
        raise BatonError(
            "cannot sign the export: the store's identity cannot be read (no baton_store row, or this role "
            "may not read it; docs/operations.md, 'Store identity')"
        )
    rows = {row.run_id: row for row in ledger.runs()}
    if run_id is not None and run_id not in rows:
        raise RunNotFound(f"no run {run_id!r} in this store")
    if run_id is None:
        streams = sorted(rows, key=lambda run: run != REGISTRY_RUN)  # the registry first, then by id
    elif ledger.state(REGISTRY_RUN).signatures_required:
        streams = list(dict.fromkeys([REGISTRY_RUN, run_id]))
    else:
        streams = [run_id]
    heads = tuple(StreamHead(stream, rows[stream].head, rows[stream].head_digest) for stream in streams)
    with open_output() as out:
        for head in heads:
            with contextlib.closing(stored_rows(ledger, head.run_id, upto=head.position)) as stored:
                for _, data in stored:
                    out.write(canonical_bytes(_generic.decode(data)))
        scope: Literal["run", "store"] = "store" if run_id is None else "run"
        unsigned = HeadStatement(identity.store_id, identity.public_key, ledger.clock.now(), scope, heads)
        statement = msgspec.structs.replace(unsigned, signature=identity.sign(signed_bytes(unsigned)))
        out.write(statement_line(statement))
    return statement


class StatementCheck(NamedTuple):
    status: Status  # verified with the trusted key, not checked against one, missing, or not verifying
    store_id: str  # the store the statement names ("" without one)
    problems: list[Problem]


def check_statement(line: bytes | None, found: list[tuple[str, int, str | None]], trust: str | None) -> StatementCheck:
    """The head statement's ``line`` (None: the export has none) against the streams ``found`` in the
    file (run id, last position, last digest, in file order), trusting the key ``trust`` if given.

    Without ``trust`` the statement is checked only against the key it names itself: that finds a
    damaged statement, never a forged one, so the status is ``unchecked``.
    """
    run_id, head = (found[-1][0], max(found[-1][1], 1)) if found else ("", 1)
    if line is None:
        if trust is None:
            return StatementCheck("missing", "", [])
        detail = "the export has no head statement: nothing vouches for where its runs end"
        return StatementCheck("missing", "", [Problem(run_id, head, "head_unsigned", detail)])
    try:
        statement = _statement.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        detail = f"the head statement is not readable ({exc})"
        return StatementCheck("invalid", "", [Problem(run_id, head, "head_signature_invalid", detail)])
    key = statement.public_key if trust is None else trust
    reason = ""
    if statement.public_key != key:
        reason = f"signed as {statement.store_id} with {statement.public_key}, not with the trusted key"
    elif not verify_store_signature(key, statement.signature, signed_bytes(statement)):
        reason = f"its signature does not verify with {'the trusted key' if trust else 'the key it names'}"
    elif store_id_of(raw_public_key(key)) != statement.store_id:
        reason = f"the store id {statement.store_id} is not the id of its key"
    problems = [Problem(run_id, head, "head_signature_invalid", reason)] if reason else []
    problems.extend(stated_heads(statement, found))
    status: Status = "invalid" if reason else "verified" if trust is not None else "unchecked"
    return StatementCheck(status, statement.store_id, problems)
