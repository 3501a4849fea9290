"""The wire format from a shell: ``baton submit`` reads it, ``baton schema`` describes it."""

from __future__ import annotations

import contextlib
import sys

import click
import msgspec

from baton.adapters.bootstrap import open_ledger
from baton.adapters.cli.identity import read_key
from baton.adapters.cli.options import echo_json, store_option
from baton.adapters.wire import decode_submission
from baton.domain.commands import Submission, Verdict
from baton.domain.events import RecordedEvent

__all__ = ["COMMANDS"]

SCHEMAS = {"submission": Submission, "verdict": Verdict, "event": RecordedEvent}


@click.command("submit")
@store_option
@click.option("--key", "key_file", metavar="FILE", help="sign every line with this private key (the line's worker's)")
def submit(store: str | None, key_file: str | None) -> int:
    """JSON Lines submissions on stdin -> verdict lines.

    Every line is answered, in order: a malformed one (not JSON, not UTF-8, not a submission)
    gets a ``malformed`` rejection and the stream goes on. With --key each line is
    signed as it is read (its ``worker`` must be the key's principal).
    """
    key = read_key(key_file) if key_file is not None else None
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        for raw in sys.stdin.buffer:  # bytes: a line that is not UTF-8 is answered, not fatal
            line = raw.strip()
            if not line:
                continue
            decoded = decode_submission(line)
            if isinstance(decoded, Verdict):
                echo_json(decoded)
                continue
            echo_json(ledger.submit(key.sign(decoded) if key is not None else decoded))
    return 0


@click.command("schema")
@click.argument("what", type=click.Choice(list(SCHEMAS)), default="submission", metavar="[submission|verdict|event]")
def schema(what: str) -> int:
    """Print the JSON Schema of the wire format."""
    echo_json(msgspec.json.schema(SCHEMAS[what]))
    return 0


COMMANDS = (submit, schema)
