"""The auditor's commands run as a user would: real processes on the demo's embedded store."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import msgspec
import pytest
from test_cli import baton, lines, rewrite_worker

from baton.adapters.cli import audit as cli_audit
from baton.adapters.cli import main
from baton.adapters.eventstore.store_identity import new_identity
from baton.domain.chain import envelope_digest
from baton.domain.export_head import HeadStatement, StreamHead, signed_bytes, statement_line


def in_process(*args: str) -> tuple[int, str]:
    """``baton ARGS`` in this process (no interpreter start-up): exit status and stdout."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue()


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose ./baton.db holds the demo's committed run (23 events)."""
    directory = tmp_path_factory.mktemp("demo")
    result = baton(directory, "demo")
    assert result.returncode == 0, result.stderr
    return directory


@pytest.fixture(scope="module")
def run_id(demo_dir: Path) -> str:
    return str(lines(baton(demo_dir, "runs", "--json").stdout)[0]["run_id"])


def test_audit_of_a_clean_store_exits_0_with_the_json_shape(demo_dir: Path, run_id: str) -> None:
    """Given the demo store, when `baton audit --all --json` runs, then ok with counts and no problems, exit 0:
    the demo run's 23 events and the principal registry's 4 (opened, an operator, two workers)."""
    result = baton(demo_dir, "audit", "--all", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "ok": True,
        "runs_checked": 2,
        "events_checked": 27,
        "problems": [],
        "identities_verified": True,
    }
    assert result.stderr == ""  # no progress bar when stderr is not a terminal
    one = baton(demo_dir, "audit", run_id)
    assert one.returncode == 0
    assert "audited 1 runs, 23 events: ok" in one.stdout


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("audit",), 2),
        (("audit", "no-such-run"), 1),
        (("audit", "--all", "--store", "sqlite:///empty.db"), 3),
        (("audit", "x", "--all"), 2),
    ],
    ids=["no-run", "unknown-run", "uninitialised-store", "both"],
)
def test_usage_unknown_run_and_store_errors_exit_by_the_table(demo_dir: Path, args: tuple[str, ...], code: int) -> None:
    """Given a missing RUN_ID (2), an unknown run (1) or a store without tables (3), when audited,
    then it exits with the table's code and a message."""
    result = baton(demo_dir, *args)
    assert result.returncode == code, result.stdout + result.stderr
    assert result.stderr.startswith("baton:")


def test_a_tampered_store_exits_4_naming_code_and_position(demo_dir: Path, run_id: str, tmp_path: Path) -> None:
    """Given one value of event 3 changed in the database, when audited, then exit 4 with digest_mismatch at 3."""
    shutil.copy(demo_dir / "baton.db", tmp_path / "baton.db")
    rewrite_worker(tmp_path / "baton.db", run_id, 3, "mallory")

    result = baton(tmp_path, "audit", "--all", "--json")

    assert result.returncode == 4, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert report["problems"][0] == {
        **report["problems"][0],
        "run_id": run_id,
        "position": 3,
        "code": "digest_mismatch",
    }
    assert set(report["problems"][0]) == {"run_id", "position", "code", "detail"}


def test_export_round_trip_verifies_and_a_tampered_export_fails(demo_dir: Path, run_id: str, tmp_path: Path) -> None:
    """Given an export of the demo run (its signed store's registry first), when verified it passes,
    signatures included; when one line is altered, it fails there."""
    export = tmp_path / "run.jsonl"
    assert baton(demo_dir, "export", run_id, "--format", "jsonl", "-o", str(export)).returncode == 0
    every = [json.loads(line) for line in export.read_text().splitlines()]
    assert [row["run_id"] for row in every[:4]] == ["baton:registry"] * 4
    rows, statement = every[4:-1], every[-1]
    assert statement["statement"] == "baton.export-head.v1"
    assert [row["position"] for row in rows] == [str(n) for n in range(1, 24)]  # canonical: integers as strings
    history = lines(baton(demo_dir, "history", run_id, "--json").stdout)
    assert [row["digest"] for row in rows] == [h["digest"] for h in history]

    code, verified = in_process("verify-export", str(export), "--json", "--expect-head", rows[-1]["digest"])
    assert code == 0, verified
    assert json.loads(verified) == {
        "ok": True,
        "runs_checked": 2,
        "events_checked": 27,
        "problems": [],
        "identities_verified": True,  # every signature checked against the registry in the file
        "head_statement": "unchecked",  # signed, but no --trust key to check it against
        "store_id": statement["store_id"],
    }

    text = export.read_text().splitlines(keepends=True)
    text[4 + 6] = text[4 + 6].replace('"worker":"worker-a"', '"worker":"worker-z"', 1)
    export.write_text("".join(text))
    failed = baton(tmp_path, "verify-export", str(export), "--json")  # a real process: no store anywhere
    assert failed.returncode == 4
    assert json.loads(failed.stdout)["problems"][0]["position"] == 7
    assert json.loads(failed.stdout)["problems"][0]["code"] == "digest_mismatch"

    truncated = tmp_path / "short.jsonl"
    truncated.write_text("".join(text[:5]))
    code, wrong_head = in_process("verify-export", str(truncated), "--json", "--expect-head", rows[-1]["digest"])
    assert code == 4
    assert [p["code"] for p in json.loads(wrong_head)["problems"]] == ["head_mismatch"]
    assert in_process("verify-export", str(tmp_path / "missing.jsonl"))[0] == 2


def test_explain_tells_the_run_at_a_position(demo_dir: Path, run_id: str) -> None:
    """Given the demo run, when explained at position 5 and at the head, then the owner, class and audit are told."""
    early = baton(demo_dir, "explain", run_id, "--at", "5")
    assert early.returncode == 0, early.stderr
    assert "At position 5" in early.stdout
    assert "owned by 'worker-a' at epoch 1" in early.stdout
    assert "'op-2' (effect, editor@1, intended at 5)" in early.stdout  # its outcome is not recorded yet
    assert "would be R5" in early.stdout  # reconcile first, and another worker must take a new epoch
    assert "audits clean" in early.stdout
    head = json.loads(in_process("explain", run_id, "--json", "--store", f"sqlite:///{demo_dir / 'baton.db'}")[1])
    assert head["position"] == 23
    assert any("completed" in sentence and "R0" not in sentence for sentence in head["sentences"])
    assert any("R0" in sentence for sentence in head["sentences"])
    assert in_process("explain", "no-such-run", "--store", f"sqlite:///{demo_dir / 'baton.db'}")[0] == 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_with_rate_on_a_terminal_and_never_with_json(
    demo_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given stderr is a terminal (and the bar's threshold lowered), when audited, then a bar with ev/s; with
    --json, no bar."""
    monkeypatch.setattr(cli_audit, "PROGRESS_MIN_EVENTS", 1)
    store = f"sqlite:///{demo_dir / 'baton.db'}"
    for extra, drawn in (((), True), (("--json",), False)):
        terminal = _Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        assert main(["audit", "--all", "--store", store, *extra]) == 0
        assert ("ev/s" in terminal.getvalue()) is drawn
        assert "27/27 events" in terminal.getvalue() or not drawn  # the run's 23, the registry's 4
    capsys.readouterr()


def test_a_forged_signature_in_an_export_is_found_offline(demo_dir: Path, run_id: str, tmp_path: Path) -> None:
    """Given an export whose last event got another event's signature and a re-sealed digest (its chain
    still verifies), when verified with no store, then bad_signature names its position (and the re-sealed
    head is not the one the store stated)."""
    export = tmp_path / "run.jsonl"
    assert baton(demo_dir, "export", run_id, "--format", "jsonl", "-o", str(export)).returncode == 0
    *text, statement = export.read_text().splitlines()
    last, earlier = json.loads(text[-1]), json.loads(text[-2])
    last["signature"] = earlier["signature"]
    del last["digest"]
    last["digest"] = envelope_digest(last)
    export.write_text("\n".join([*text[:-1], json.dumps(last), statement]) + "\n")

    failed = baton(tmp_path, "verify-export", str(export), "--json")

    assert failed.returncode == 4
    found = [(p["position"], p["code"]) for p in json.loads(failed.stdout)["problems"]]
    assert found == [(23, "bad_signature"), (23, "head_mismatch")]


# -- the head statement the store signs at the end of an export ---------------------------------


@pytest.fixture(scope="module")
def store_key(demo_dir: Path) -> str:
    """The demo store's public key, as `baton store id` prints it: the key a verifier trusts."""
    return str(json.loads(baton(demo_dir, "store", "id", "--json").stdout)["public_key"])


def exported(demo_dir: Path, run_id: str, tmp_path: Path) -> tuple[list[dict[str, object]], dict[str, object]]:
    """The demo run's export: its envelopes (the registry's first) and its head statement."""
    export = tmp_path / "run.jsonl"
    assert baton(demo_dir, "export", run_id, "-o", str(export)).returncode == 0
    *events, statement = (json.loads(line) for line in export.read_text().splitlines())
    return events, statement


def verified(tmp_path: Path, lines: list[dict[str, object]], *args: str) -> tuple[int, dict[str, object]]:
    """verify-export --json of these lines, written as they are (the file's own spelling does not matter)."""
    path = tmp_path / "edited.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, out = in_process("verify-export", str(path), "--json", *args)
    return code, json.loads(out)


def codes(report: dict[str, object]) -> list[tuple[str, int, str]]:
    problems = report["problems"]
    assert isinstance(problems, list)
    return [(p["run_id"], p["position"], p["code"]) for p in problems]


def test_a_signed_export_verifies_with_the_stores_key(
    demo_dir: Path, run_id: str, store_key: str, tmp_path: Path
) -> None:
    """Given an export, when verified with --trust and the store's public key, then the statement is verified
    and names every stream's head; without --trust the output says it was not checked, and passes."""
    events, statement = exported(demo_dir, run_id, tmp_path)
    assert statement["public_key"] == store_key
    assert statement["scope"] == "run"
    assert statement["heads"] == [
        {"run_id": "baton:registry", "position": "4", "digest": events[3]["digest"]},
        {"run_id": run_id, "position": "23", "digest": events[-1]["digest"]},
    ]

    code, report = verified(tmp_path, [*events, statement], "--trust", store_key)
    assert (code, report["ok"], report["head_statement"]) == (0, True, "verified")

    plain = baton(tmp_path, "verify-export", str(tmp_path / "run.jsonl"))
    assert plain.returncode == 0, plain.stdout
    assert "not checked against a trusted key" in plain.stdout

    every = tmp_path / "all.jsonl"
    assert baton(demo_dir, "export", "--all", "-o", str(every)).returncode == 0
    whole = json.loads(every.read_text().splitlines()[-1])
    assert whole["scope"] == "store"
    assert [head["run_id"] for head in whole["heads"]] == ["baton:registry", run_id]
    assert in_process("verify-export", str(every), "--trust", store_key)[0] == 0


def test_a_cut_tail_is_refused(demo_dir: Path, run_id: str, store_key: str, tmp_path: Path) -> None:
    """Given an export whose last two events were removed (the chain that is left still verifies), when verified
    with --trust, then tail_cut at the first missing position, exit 4; the chain alone would have passed."""
    events, statement = exported(demo_dir, run_id, tmp_path)

    code, report = verified(tmp_path, [*events[:-2], statement], "--trust", store_key)

    assert code == 4
    assert codes(report) == [(run_id, 22, "tail_cut")]
    assert verified(tmp_path, events[:-2])[0] == 0  # without the statement nothing tells a short chain
    code, report = verified(tmp_path, events[:-2], "--trust", store_key)  # nor with the statement dropped
    assert (code, codes(report)) == (4, [(run_id, 21, "head_unsigned")])


def test_a_rechained_export_is_refused(demo_dir: Path, run_id: str, store_key: str, tmp_path: Path) -> None:
    """Given an export with event 10 rewritten and every event from there sealed again (digests and links: a
    valid chain, signatures untouched), when verified with --trust, then head_mismatch at 23, exit 4."""
    events, statement = exported(demo_dir, run_id, tmp_path)
    rechained = [dict(event) for event in events]
    for index in range(4 + 9, len(rechained)):
        event = rechained[index]
        if index == 4 + 9:
            event["recorded_at"] = str(int(str(event["recorded_at"])) + 1)
        event["prev_digest"] = rechained[index - 1]["digest"]
        del event["digest"]
        event["digest"] = envelope_digest(event)
    assert verified(tmp_path, rechained)[0] == 0  # the chain alone holds

    code, report = verified(tmp_path, [*rechained, statement], "--trust", store_key)

    assert code == 4
    assert codes(report) == [(run_id, 23, "head_mismatch")]


def test_a_statement_signed_by_another_key_is_refused(
    demo_dir: Path, run_id: str, store_key: str, tmp_path: Path
) -> None:
    """Given a cut export with a new statement for its shorter heads, signed by another key (naming that key,
    or the store's), when verified with --trust and the store's key, then head_signature_invalid, exit 4."""
    events, _ = exported(demo_dir, run_id, tmp_path)
    kept = events[:-2]
    heads = (StreamHead("baton:registry", 4, str(kept[3]["digest"])), StreamHead(run_id, 21, str(kept[-1]["digest"])))
    forger = new_identity()
    for named in (forger.public_key, store_key):
        unsigned = HeadStatement(forger.store_id, named, 1, "run", heads)
        forged = msgspec.structs.replace(unsigned, signature=forger.sign(signed_bytes(unsigned)))

        code, report = verified(tmp_path, [*kept, json.loads(statement_line(forged))], "--trust", store_key)

        assert code == 4
        assert codes(report) == [(run_id, 21, "head_signature_invalid")]
        assert report["head_statement"] == "invalid"
    bad_key = baton(tmp_path, "verify-export", str(tmp_path / "run.jsonl"), "--trust", "ed25519:nonsense")
    assert bad_key.returncode == 2
