"""Keys and principals from a shell: given a new store, when it is initialised, then it verifies
identities with a fresh operator key; principals are added and revoked by that key; ``submit --key``
signs each line, and a line forged under another principal's name is refused."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from test_cli import baton

from baton.adapters.wire import encode_submission
from baton.domain.commands import AcquireLease, OpenRun, Submission
from baton.domain.events import BlobRef, Placement

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
