"""The ``baton`` command line, run as a user would: a real process on a real embedded store."""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

OPEN = {
    "type": "open_run",
    "release_id": "rel-1",
    "schema_name": "agent-state",
    "schema_version": 1,
    "task_ref": {"digest": "sha256:00", "size": 1},
}


def baton(
    cwd: Path, *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "BATON_STORE"} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "baton.adapters.cli", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        check=False,
    )


def rewrite_worker(db: Path, run_id: str, position: int, worker: str) -> None:
    """Change one stored event's worker behind the ledger's back (the append-only trigger dropped)."""
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER stored_events_no_update")
        (state,) = conn.execute(
            "SELECT state FROM stored_events WHERE originator_id = ? AND originator_version = ?", (run_id, position)
        ).fetchone()
        envelope = json.loads(state)
        envelope["worker"] = worker
        conn.execute(
            "UPDATE stored_events SET state = ? WHERE originator_id = ? AND originator_version = ?",
            (json.dumps(envelope).encode(), run_id, position),
        )


def lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_demo_runs_on_the_embedded_default_and_rejects_the_stale_worker(tmp_path: Path) -> None:
    """Given an empty directory, when `baton demo` runs, then it exits 0 with a stale_epoch refusal and a
    committed run in ./baton.db that `runs` and `history` can read."""
    result = baton(tmp_path, "demo")
    assert result.returncode == 0, result.stderr
    assert "REJECTED: stale_epoch" in result.stdout
    assert (tmp_path / "baton.db").exists()
    runs = lines(baton(tmp_path, "runs", "--json").stdout)
    assert len(runs) == 1
    run = runs[0]
    assert run["stage"] == "COMMITTED"
    assert run["epoch"] == 2
    assert run["events"] == 23
    history = lines(baton(tmp_path, "history", str(run["run_id"]), "--json").stdout)
    assert [h["position"] for h in history] == list(range(1, 24))
    for earlier, later in itertools.pairwise(history):
        assert later["prev_digest"] == earlier["digest"]
    after_takeover = next(h["position"] for h in history if h["type"] == "LeaseGranted" and h["epoch"] == 2)
    assert all(h["epoch"] == 2 for h in history if int(str(h["position"])) > int(str(after_takeover)))
    assert {"position", "type", "epoch", "worker", "digest", "prev_digest", "recorded_at"} <= set(history[0])
    assert baton(tmp_path, "verify", str(run["run_id"])).returncode == 0


def test_submit_gives_one_verdict_per_line_and_survives_malformed_lines(tmp_path: Path) -> None:
    """Given JSON Lines with a good, a duplicate, a conflicting, a broken and a stale submission, when piped
    into `baton submit`, then each gets its verdict and the process keeps going."""
    store = f"sqlite:///{tmp_path / 's.db'}"
    assert baton(tmp_path, "store", "init", "--store", store, "--unsigned").returncode == 0
    acquire = {"type": "acquire_lease", "placement": {"worker": "w1"}, "ttl_ms": 60000}
    conflicting = {**OPEN, "release_id": "rel-2"}
    stale = {"type": "renew_lease"}
    submissions = [
        {"submission_id": "s1", "run_id": "r1", "worker": "w1", "command": OPEN},
        {"submission_id": "s1", "run_id": "r1", "worker": "w1", "command": OPEN},
        {"submission_id": "s1", "run_id": "r1", "worker": "w1", "command": conflicting},
        "this is not json",
        {"submission_id": "s2", "run_id": "r1", "worker": "w1", "command": acquire},
        {"submission_id": "s3", "run_id": "r1", "worker": "w1", "epoch": 7, "command": stale},
        {"submission_id": "s4", "run_id": "r1", "worker": "w1", "command": {"type": "no_such_command"}},
    ]
    stdin = "\n".join(s if isinstance(s, str) else json.dumps(s) for s in submissions) + "\n"
    result = baton(tmp_path, "submit", "--store", store, stdin=stdin)
    assert result.returncode == 0, result.stderr
    verdicts = lines(result.stdout)
    assert [(v["verdict"], v["reason"], v["position"]) for v in verdicts] == [
        ("accepted", None, 1),
        ("duplicate", None, 1),
        ("rejected", "submission_conflict", None),
        ("rejected", "malformed", None),
        ("accepted", None, 2),
        ("rejected", "stale_epoch", None),
        ("rejected", "malformed", None),
    ]
    assert verdicts[5]["current_epoch"] == 1
    assert {"submission_id", "verdict", "reason", "run_id", "position"} <= set(verdicts[0])
    assert len(lines(baton(tmp_path, "history", "r1", "--json", "--store", store).stdout)) == 2


def test_store_url_comes_from_the_environment_when_no_flag_is_given(tmp_path: Path) -> None:
    """Given BATON_STORE, when a command runs without --store, then it uses that store, not ./baton.db."""
    store = f"sqlite:///{tmp_path / 'env.db'}"
    assert baton(tmp_path, "store", "init", "--unsigned", env={"BATON_STORE": store}).returncode == 0
    assert (tmp_path / "env.db").exists()
    assert not (tmp_path / "baton.db").exists()


def test_uninitialised_store_is_a_clear_error(tmp_path: Path) -> None:
    """Given a store nobody initialised, when `baton runs` reads it, then it exits 3 and says how to fix it."""
    result = baton(tmp_path, "runs", "--store", f"sqlite:///{tmp_path / 'none.db'}")
    assert result.returncode == 3
    assert "baton store init" in result.stderr


@pytest.mark.parametrize("what", ["submission", "verdict", "event"])
def test_schema_prints_a_json_schema(tmp_path: Path, what: str) -> None:
    """Given the wire types, when `baton schema` runs, then it prints a JSON Schema document."""
    result = baton(tmp_path, "schema", what)
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert "$defs" in schema or "properties" in schema


def test_demo_runs_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    """Given a PostgreSQL store, when `baton demo --store URL` runs, then the same story holds there."""
    result = baton(tmp_path, "demo", "--store", postgres_url)
    assert result.returncode == 0, result.stderr
    assert "REJECTED: stale_epoch" in result.stdout
    runs = lines(baton(tmp_path, "runs", "--json", "--store", postgres_url).stdout)
    assert runs[0]["stage"] == "COMMITTED"


def test_resume_state_and_budgets_read_the_demo_run(tmp_path: Path) -> None:
    """Given the demo's committed run, when resume, state --at and budgets run, then they report its final
    class, its state back in time and the usage per worker."""
    assert baton(tmp_path, "demo").returncode == 0
    run_id = str(lines(baton(tmp_path, "runs", "--json").stdout)[0]["run_id"])

    resumed = json.loads(baton(tmp_path, "resume", run_id, "--worker", "worker-c", "--json").stdout)
    assert resumed["resumability"]["class"] == "R0"
    assert resumed["checkpoint"]["checkpoint_hash"].startswith("sha256:")
    assert resumed["checkpoint"]["position"] == 23
    history = lines(baton(tmp_path, "history", run_id, "--json").stdout)
    last_work = [event for event in history if event["type"] in {"TransitionRecorded", "ObservationRecorded"}][-1]
    assert resumed["resume_from"] == {  # what worker-c would owe after taking the run over
        "position": last_work["position"],
        "prefix_digest": last_work["digest"],
        "required": True,
    }
    sealed = [event["position"] for event in history if event["type"] == "CheckpointSealed"]
    assert resumed["replay_after_position"] == sealed[-1]  # the prefix starts after the last sealed checkpoint
    intents_after = [e["position"] for e in history if e["type"] == "IntentRecorded" and e["position"] > sealed[-1]]
    assert resumed["replay_prefix"] == {  # summarised unless --prefix asks for the steps
        "steps": len(intents_after),
        "first_position": sealed[-1] + 1,
        "last_position": 23,
        "digest": history[-1]["digest"],
    }
    assert resumed["uncertain"] == []
    with_steps = json.loads(baton(tmp_path, "resume", run_id, "--worker", "worker-c", "--json", "--prefix").stdout)
    assert [step["intent_position"] for step in with_steps["replay_prefix"]] == intents_after

    at_13 = json.loads(baton(tmp_path, "state", run_id, "--at", "13", "--json").stdout)
    assert (at_13["position"], at_13["stage"], at_13["owner"], at_13["owner_epoch"]) == (13, "VERIFIED", "worker-a", 1)

    by_worker = {row["worker"]: row for row in lines(baton(tmp_path, "budgets", "--by", "worker", "--json").stdout)}
    assert (by_worker["worker-a"]["calls"], by_worker["worker-b"]["calls"]) == (3, 1)


def test_resume_of_a_run_with_a_lost_observation_needs_reconciliation(tmp_path: Path) -> None:
    """Given a run whose last effect has no recorded outcome, when another worker asks to resume it, then the
    answer is R5 naming the effect, and the lease transfer is among the reasons."""
    store = f"sqlite:///{tmp_path / 'r5.db'}"
    assert baton(tmp_path, "store", "init", "--store", store, "--unsigned").returncode == 0
    intent = {
        "type": "record_intent",
        "op_id": "push-1",
        "kind": "effect",
        "tool_contract": "git@2",
        "context": {"turn": 1, "operation": "push", "arguments": {"branch": "main"}},
        "idempotency_key": "k-1",
    }
    submissions = [
        {"submission_id": "s1", "run_id": "r", "worker": "w1", "command": OPEN},
        {
            "submission_id": "s2",
            "run_id": "r",
            "worker": "w1",
            "command": {"type": "acquire_lease", "placement": {"worker": "w1"}},
        },
        {"submission_id": "s3", "run_id": "r", "worker": "w1", "epoch": 1, "command": intent},
    ]
    stdin = "\n".join(json.dumps(s) for s in submissions) + "\n"
    assert all(
        v["verdict"] == "accepted" for v in lines(baton(tmp_path, "submit", "--store", store, stdin=stdin).stdout)
    )

    args = ("resume", "r", "--worker", "w2", "--tool-contract", "git@2", "--json", "--store", store)
    resumed = json.loads(baton(tmp_path, *args).stdout)
    assert resumed["resumability"]["class"] == "R5"
    assert any("push-1" in reason for reason in resumed["resumability"]["reasons"])
    assert any("epoch" in reason for reason in resumed["resumability"]["reasons"])
    assert [u["op_id"] for u in resumed["uncertain"]] == ["push-1"]

    missing = json.loads(baton(tmp_path, "resume", "r", "--worker", "w2", "--json", "--store", store).stdout)
    assert missing["resumability"]["class"] == "MIGRATION_UNSAFE"


def test_serve_refuses_an_unknown_bus_url_with_exit_2(tmp_path: Path) -> None:
    """Given an initialised store, when ``baton serve`` gets an http:// bus, then exit 2 and why."""
    store = f"sqlite:///{tmp_path / 'baton.db'}"
    assert baton(tmp_path, "store", "init", "--store", store, "--unsigned").returncode == 0

    result = baton(tmp_path, "serve", "--store", store, "--bus", "http://127.0.0.1:9")

    assert result.returncode == 2
    assert "unsupported bus URL 'http://127.0.0.1:9'" in result.stderr
