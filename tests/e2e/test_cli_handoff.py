"""``baton handoff``: a run leaves one store as a document and continues in another, from a shell."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli import baton, lines

from baton.domain.decide import context_digest
from baton.domain.events import IntentContext
from baton.domain.handoff_document import state_digest_of

STATE = {"goal": "fix the flaky retry", "candidates": [{"patch": "p1", "verdict": "pending"}]}


def sealed_run(tmp_path: Path, store: str) -> None:
    """A run in ``store`` whose holder w1 sealed ``STATE`` at CANDIDATE_READY."""
    digest = state_digest_of(STATE)
    commands = [
        {
            "type": "open_run",
            "release_id": "rel-1",
            "schema_name": "coding-agent",
            "schema_version": 1,
            "task_ref": {"digest": digest, "size": 80},
        },
        {"type": "acquire_lease", "placement": {"worker": "w1", "tool_contracts": ["git@1"]}, "ttl_ms": 600000},
        {"type": "record_transition", "to_stage": "CANDIDATE_READY", "state_digest": digest},
        {"type": "seal_checkpoint", "checkpoint_id": "ckpt-1", "state_digest": digest},
    ]
    submissions = [
        {"submission_id": f"s{i}", "run_id": "r1", "worker": "w1", "command": command, "epoch": 0 if i < 2 else 1}
        for i, command in enumerate(commands)
    ]
    assert baton(tmp_path, "store", "init", "--store", store, "--unsigned").returncode == 0
    verdicts = lines(baton(tmp_path, "submit", "--store", store, stdin="\n".join(map(json.dumps, submissions))).stdout)
    assert [v["verdict"] for v in verdicts] == ["accepted"] * 4


def store_id(tmp_path: Path, store: str) -> dict[str, str]:
    found: dict[str, str] = json.loads(baton(tmp_path, "store", "id", "--json", "--store", store).stdout)
    return found


def test_export_claim_then_import_moves_the_run_between_stores_exactly_once(tmp_path: Path) -> None:
    """Given a sealed run in store A exported to w2 in store B, when B imports it without a claim, with
    a wrong digest, with A's receipt (twice) and C tries the same receipt, then only B continues it,
    once, at the next epoch, migrated; A, told of the import, says it handed the run off."""
    source, target, other = (f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db", "c.db"))
    sealed_run(tmp_path, source)
    (tmp_path / "state.json").write_text(json.dumps(STATE), encoding="utf-8")
    for store in (target, other):
        assert baton(tmp_path, "store", "init", "--store", store, "--unsigned").returncode == 0
    b, a = store_id(tmp_path, target), store_id(tmp_path, source)

    exported = baton(
        tmp_path, "handoff", "export", "r1", "--to", "w2", "--state", "state.json", "--to-version", "2",
        "--tool-contract", "git@1", "--to-store", b["store_id"], "--store", source,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    digest = exported.stderr.strip()
    (tmp_path / "doc.json").write_text(exported.stdout, encoding="utf-8")
    claim = ("handoff", "claim", "r1", "--digest", digest, "--for-store", b["store_id"], "--store", source)
    receipt, receipt_again = baton(tmp_path, *claim), baton(tmp_path, *claim)
    assert receipt.returncode == 0, receipt.stdout + receipt.stderr
    assert receipt.stdout == receipt_again.stdout  # a lost reply is asked for again: the same receipt
    (tmp_path / "receipt.json").write_text(receipt.stdout, encoding="utf-8")
    elsewhere = baton(
        tmp_path, "handoff", "claim", "r1", "--digest", digest, "--for-store", "store-c", "--store", source
    )
    assert (elsewhere.returncode, json.loads(elsewhere.stdout)["reason"]) == (1, "already_claimed")

    def import_into(store: str, expected: str = digest, *claimed: str) -> tuple[int, dict[str, object]]:
        done = baton(tmp_path, "handoff", "import", "doc.json", "--expect-digest", expected, *claimed, "--store", store)
        return done.returncode, json.loads(done.stdout)

    with_receipt = ("--receipt", "receipt.json", "--trust", a["public_key"])
    unclaimed = import_into(target)
    wrong = import_into(target, "sha256:" + "1" * 64, *with_receipt)
    not_here = import_into(other, digest, *with_receipt)
    untrusted = import_into(target, digest, "--receipt", "receipt.json", "--trust", b["public_key"])
    first, again = import_into(target, digest, *with_receipt), import_into(target, digest, *with_receipt)

    assert (unclaimed[0], unclaimed[1]["reason"]) == (1, "claim_required")
    assert (wrong[0], wrong[1]["reason"]) == (1, "digest_mismatch")
    assert (not_here[0], not_here[1]["reason"]) == (1, "claim_not_for_this_store")
    assert (untrusted[0], untrusted[1]["reason"]) == (1, "bad_signature")
    assert (first[0], first[1]["verdict"]) == (0, "accepted")
    assert (again[1]["verdict"], again[1]["position"]) == ("duplicate", first[1]["position"])
    assert baton(tmp_path, "runs", "--json", "--store", other).stdout.strip() == ""  # C stored nothing
    status = json.loads(baton(tmp_path, "handoff", "status", "r1", "--store", target).stdout)
    assert (status["accepted"], status["holder"], status["epoch"]) == (digest, "w2", 2)
    history = lines(baton(tmp_path, "history", "r1", "--json", "--store", target).stdout)
    assert [h["type"] for h in history] == ["HandoffAccepted", "LeaseGranted"]
    assert json.loads(exported.stdout)["state"]["attempts"] == 1  # migrated once, at export
    assert baton(tmp_path, "verify", "r1", "--store", target).returncode == 0

    confirmed = baton(tmp_path, "handoff", "confirm", "r1", "--digest", digest, "--position", "1", "--store", source)
    assert confirmed.returncode == 0, confirmed.stdout
    at_source = json.loads(baton(tmp_path, "handoff", "status", "r1", "--store", source).stdout)
    assert at_source["said"].startswith(f"handed off to {b['store_id']} at digest {digest}")


def test_gate_by_idempotency_key_from_a_shell(tmp_path: Path) -> None:
    """Given w1 holds a run with an observed intent that gave the host key K0 and an open one with K1,
    when `baton gate --key` is asked, then K1 is allowed (the same answer as --op), K0 is
    already_observed, an unknown key unknown_operation, and both --op and --key (or neither) is a
    usage error (exit 2)."""
    store = f"sqlite:///{tmp_path / 'a.db'}"
    write = {"turn": 1, "operation": "write", "effect": "write", "arguments": {"path": "a.py"}}
    observed = context_digest(IntentContext(1, "write", effect="write", arguments={"path": "a.py"}))
    commands = [
        {"type": "open_run", "release_id": "rel-1", "schema_name": "s", "schema_version": 1,
         "task_ref": {"digest": "sha256:" + "a" * 64, "size": 1}},
        {"type": "acquire_lease", "placement": {"worker": "w1"}, "ttl_ms": 600000},
        {"type": "record_intent", "op_id": "op-0", "kind": "effect", "tool_contract": "fs@1", "context": write,
         "idempotency_key": "K0"},
        {"type": "record_observation", "op_id": "op-0", "context_digest": observed, "outcome": "ok"},
        {"type": "record_intent", "op_id": "op-1", "kind": "effect", "tool_contract": "fs@1", "context": write,
         "idempotency_key": "K1"},
    ]  # fmt: skip
    submissions = [
        {"submission_id": f"s{i}", "run_id": "r1", "worker": "w1", "command": command, "epoch": 0 if i < 2 else 1}
        for i, command in enumerate(commands)
    ]
    assert baton(tmp_path, "store", "init", "--store", store, "--unsigned").returncode == 0
    verdicts = lines(baton(tmp_path, "submit", "--store", store, stdin="\n".join(map(json.dumps, submissions))).stdout)
    assert [v["verdict"] for v in verdicts] == ["accepted"] * 5, verdicts

    def gate(*how: str) -> tuple[int, dict[str, object]]:
        asked = baton(tmp_path, "gate", "r1", "--worker", "w1", "--epoch", "1", *how, "--json", "--store", store)
        return asked.returncode, json.loads(asked.stdout)

    by_key = gate("--key", "K1")
    assert by_key == gate("--op", "op-1")
    assert (by_key[0], by_key[1]["reason"]) == (0, "allowed")
    used = gate("--key", "K0")
    assert (used[0], used[1]["reason"]) == (1, "already_observed")
    assert "K0" in str(used[1]["detail"])
    assert gate("--key", "K9")[1]["reason"] == "unknown_operation"
    asked = ("gate", "r1", "--worker", "w1", "--epoch", "1", "--store", store)
    both, neither = baton(tmp_path, *asked, "--op", "op-1", "--key", "K1"), baton(tmp_path, *asked)
    assert (both.returncode, neither.returncode) == (2, 2)
    assert "exactly one of --op and --key" in both.stderr
