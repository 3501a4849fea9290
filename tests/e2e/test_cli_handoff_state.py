"""``baton handoff state``: the migrated state exactly as a store accepted it, from that store alone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from test_cli import baton
from test_cli_handoff import STATE, sealed_run, store_id

from baton.domain.handoff_document import decode_document, state_bytes

STATE_PREFIX = b"baton.task-state.v1\x00"


def test_handoff_state_prints_the_accepted_state_whose_digest_is_the_documents(tmp_path: Path) -> None:
    """Given a run exported from A, claimed and imported into B, when `baton handoff state` asks B, then it
    prints the migrated state's canonical bytes, whose prefixed SHA-256 is the document's state digest, also
    after the document is gone; asked of A (which only prepared it) or for an unknown run, it exits 1."""
    source, target = (f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db"))
    sealed_run(tmp_path, source)
    assert baton(tmp_path, "store", "init", "--store", target, "--unsigned").returncode == 0
    (tmp_path / "state.json").write_text(json.dumps(STATE), encoding="utf-8")
    b, a = store_id(tmp_path, target), store_id(tmp_path, source)
    exported = baton(
        tmp_path, "handoff", "export", "r1", "--to", "w2", "--state", "state.json", "--to-version", "2",
        "--tool-contract", "git@1", "--to-store", b["store_id"], "--store", source,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    digest = exported.stderr.strip()
    (tmp_path / "doc.json").write_text(exported.stdout, encoding="utf-8")
    receipt = baton(
        tmp_path, "handoff", "claim", "r1", "--digest", digest, "--for-store", b["store_id"], "--store", source
    )
    (tmp_path / "receipt.json").write_text(receipt.stdout, encoding="utf-8")
    imported = baton(
        tmp_path, "handoff", "import", "doc.json", "--expect-digest", digest, "--receipt", "receipt.json",
        "--trust", a["public_key"], "--store", target,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stdout + imported.stderr
    doc = decode_document(exported.stdout.encode())
    (tmp_path / "doc.json").unlink()

    shown = baton(tmp_path, "handoff", "state", "r1", "--store", target)

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.encode() == state_bytes(doc.state)
    assert "sha256:" + hashlib.sha256(STATE_PREFIX + shown.stdout.encode()).hexdigest() == doc.state_digest
    assert json.loads(shown.stdout)["attempts"] == 1  # migrated v1 -> v2 at export, stored as accepted
    at_source = baton(tmp_path, "handoff", "state", "r1", "--store", source)
    assert at_source.returncode == 1 and at_source.stdout == ""
    assert "has no accepted handoff in this store" in at_source.stderr
    unknown = baton(tmp_path, "handoff", "state", "nope", "--store", target)
    assert unknown.returncode == 1 and "does not exist" in unknown.stderr
