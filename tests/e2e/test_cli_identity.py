"""Keys and principals from a shell: given a new store, when it is initialised, then it verifies
identities with a fresh operator key; principals are added and revoked by that key; ``submit --key``
signs each line, and a line forged under another principal's name is refused."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from test_cli import baton
from test_cli_handoff import STATE

from baton.adapters.wire import encode_submission
from baton.domain.commands import AcquireLease, OpenRun, RecordTransition, SealCheckpoint, Submission
from baton.domain.events import BlobRef, Placement
from baton.domain.handoff_document import state_digest_of
from baton.domain.stages import Stage

TASK = BlobRef("sha256:" + "ab" * 32, 11, "blob://task")


def test_a_new_store_verifies_identities_and_refuses_a_forged_line(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'baton.db'}"
    init = baton(tmp_path, "store", "init", "--store", store)
    assert init.returncode == 0, init.stderr
    assert "identities verified" in init.stdout
    operator_key = tmp_path / "baton-operator.key"
    assert stat.S_IMODE(operator_key.stat().st_mode) == 0o600

    new = baton(tmp_path, "keys", "new", "--out", "alice.key")
    public = new.stdout.strip()
    assert new.returncode == 0 and public.startswith("ed25519:") and len(public) == len("ed25519:") + 44
    assert stat.S_IMODE((tmp_path / "alice.key").stat().st_mode) == 0o600
    assert baton(tmp_path, "keys", "new", "--out", "alice.key").returncode == 2  # never overwritten
    added = baton(
        tmp_path,
        "principals",
        "add",
        "alice",
        "--role",
        "worker",
        "--public-key",
        public,
        "--key",
        "baton-operator.key",
        "--store",
        store,
    )
    assert added.returncode == 0 and json.loads(added.stdout)["verdict"] == "accepted", added.stdout + added.stderr

    lines = [
        Submission("s-1", "r1", "alice", OpenRun("rel-1", "agent", 1, TASK)),
        Submission("s-2", "r1", "alice", AcquireLease(Placement("alice"), 30_000)),
        Submission("s-3", "r1", "operator", AcquireLease(Placement("operator"), 30_000)),  # signed by alice's key
    ]
    stdin = "".join(encode_submission(s).decode() + "\n" for s in lines)
    unsigned = baton(tmp_path, "submit", "--store", store, stdin=stdin)
    assert [json.loads(line)["reason"] for line in unsigned.stdout.splitlines()] == ["signature_required"] * 3
    signed = baton(tmp_path, "submit", "--store", store, "--key", "alice.key", stdin=stdin)
    verdicts = [json.loads(line) for line in signed.stdout.splitlines()]
    assert [(v["verdict"], v["reason"]) for v in verdicts] == [
        ("accepted", None),
        ("accepted", None),
        ("rejected", "principal_mismatch"),
    ]

    revoked = baton(tmp_path, "principals", "revoke", "alice", "--key", "baton-operator.key", "--store", store)
    assert revoked.returncode == 0, revoked.stderr
    listed = json.loads(baton(tmp_path, "principals", "list", "--json", "--store", store).stdout)
    assert {(p["name"], tuple(p["roles"]), p["revoked"]) for p in listed} == {
        ("alice", ("worker",), True),
        ("operator", ("operator",), False),
    }
    again = baton(
        tmp_path,
        "principals",
        "add",
        "bob",
        "--role",
        "worker",
        "--public-key",
        public,
        "--key",
        "alice.key",
        "--store",
        store,
    )
    assert json.loads(again.stdout)["reason"] == "principal_revoked"


def test_an_unsigned_store_says_identities_are_not_verified(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'baton.db'}"
    init = baton(tmp_path, "store", "init", "--store", store, "--unsigned")

    assert init.returncode == 0 and "identities not verified" in init.stdout
    assert not (tmp_path / "baton-operator.key").exists()
    assert "identities not verified" in baton(tmp_path, "principals", "list", "--store", store).stdout


def _signed_store(tmp_path: Path, name: str, principal: str) -> tuple[str, str]:
    """A new signed store with ``principal`` registered as a worker: its URL and the principal's key file."""
    store = f"sqlite:///{tmp_path / (name + '.db')}"
    key_out = f"{name}-operator.key"
    assert baton(tmp_path, "store", "init", "--store", store, "--key-out", key_out).returncode == 0
    public = baton(tmp_path, "keys", "new", "--out", f"{principal}.key").stdout.strip()
    add = ("principals", "add", principal, "--role", "worker", "--public-key", public, "--key", key_out)
    assert baton(tmp_path, *add, "--store", store).returncode == 0
    return store, f"{principal}.key"


def test_a_handoff_between_signed_stores_is_signed_by_each_side(tmp_path: Path) -> None:
    """Given two signed stores, when w1 exports with its key, w2 (registered in both) claims in the source
    and imports with its own, then the run moves; an import without a key is refused and stores nothing."""
    source, w1_key = _signed_store(tmp_path, "a", "w1")
    target, w2_key = _signed_store(tmp_path, "b", "w2")
    listed = json.loads(baton(tmp_path, "principals", "list", "--json", "--store", target).stdout)
    w2_public = next(p["public_key"] for p in listed if p["name"] == "w2")
    add_w2 = ("principals", "add", "w2", "--role", "worker", "--public-key", w2_public)
    assert baton(tmp_path, *add_w2, "--key", "a-operator.key", "--store", source).returncode == 0
    b_id, a_id = (json.loads(baton(tmp_path, "store", "id", "--json", "--store", s).stdout) for s in (target, source))
    digest = state_digest_of(STATE)
    commands = [
        OpenRun("rel-1", "coding-agent", 1, BlobRef(digest, 80)),
        AcquireLease(Placement("w1", tool_contracts=("git@1",)), 600_000),
        RecordTransition(Stage.CANDIDATE_READY, digest),
        SealCheckpoint("ckpt-1", digest),
    ]
    stdin = "".join(
        encode_submission(Submission(f"s{i}", "r1", "w1", c, 0 if i < 2 else 1)).decode() + "\n"
        for i, c in enumerate(commands)
    )
    sealed = baton(tmp_path, "submit", "--store", source, "--key", w1_key, stdin=stdin)
    assert [json.loads(line)["verdict"] for line in sealed.stdout.splitlines()] == ["accepted"] * 4
    (tmp_path / "state.json").write_text(json.dumps(STATE), encoding="utf-8")

    exported = baton(
        tmp_path, "handoff", "export", "r1", "--to", "w2", "--state", "state.json", "--tool-contract", "git@1",
        "--to-store", b_id["store_id"], "--key", w1_key, "--store", source,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    (tmp_path / "doc.json").write_text(exported.stdout, encoding="utf-8")
    claim = ("handoff", "claim", "r1", "--digest", exported.stderr.strip(), "--for-store", b_id["store_id"])
    receipt = baton(tmp_path, *claim, "--key", w2_key, "--store", source)
    assert receipt.returncode == 0, receipt.stdout
    (tmp_path / "receipt.json").write_text(receipt.stdout, encoding="utf-8")
    imported = (
        "handoff", "import", "doc.json", "--expect-digest", exported.stderr.strip(), "--receipt", "receipt.json",
        "--trust", a_id["public_key"], "--store", target,
    )  # fmt: skip
    unsigned = baton(tmp_path, *imported)
    signed = baton(tmp_path, *imported, "--key", w2_key)

    assert json.loads(unsigned.stdout)["reason"] == "signature_required"
    assert json.loads(signed.stdout)["verdict"] == "accepted", signed.stdout
    assert json.loads(baton(tmp_path, "audit", "--all", "--json", "--store", target).stdout)["ok"] is True
