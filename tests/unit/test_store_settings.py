"""Store URLs at the edge: validated with a sentence, shown without a password, resolved once; and
libpq's connect failures read as causes (``eventstore.reachability``), without a server."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from baton.adapters.eventstore.reachability import postgres_cause
from baton.adapters.settings import BadSettings, StoreSettings, display_url

PARAMS = {"host": "db.example", "port": "5432", "user": "baton", "dbname": "ledger", "password": "pw"}


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://baton:pw@db:5432/ledger", "postgresql://baton@db:5432/ledger"),
        ("postgresql://baton@db/ledger?password=pw&sslmode=require", "postgresql://baton@db/ledger?sslmode=require"),
        ("postgresql://baton@db/ledger?password=pw", "postgresql://baton@db/ledger"),
        ("sqlite:///x.db", "sqlite:///x.db"),
        ("sqlite:////abs/x.db", "sqlite:////abs/x.db"),
    ],
)
def test_display_url_drops_the_password_and_keeps_the_rest(url: str, shown: str) -> None:
    assert display_url(url) == shown


def test_three_slashes_resolve_against_the_working_directory_and_four_are_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a working directory, then sqlite:///x.db is the file in it and sqlite:////a/x.db is /a/x.db,
    resolved when the settings are made (a later chdir moves nothing)."""
    monkeypatch.chdir(tmp_path)
    relative = StoreSettings.resolve("sqlite:///data/x.db")
    absolute = StoreSettings.resolve("sqlite:////srv/x.db")
    monkeypatch.chdir(os.sep)

    assert relative.sqlite_path == str(tmp_path / "data" / "x.db")
    assert absolute.sqlite_path == "/srv/x.db"
    assert relative.env(create_table=False)["SQLITE_DBNAME"] == str(tmp_path / "data" / "x.db")


def test_a_bad_url_is_one_sentence_naming_its_source_with_the_password_hidden() -> None:
    with pytest.raises(BadSettings) as raised:
        StoreSettings.resolve("oracle://scott:tiger@h/db")

    assert str(raised.value) == (
        "--store oracle://scott@h/db is not a store URL: Baton knows no oracle:// stores; use sqlite:///FILE "
        "(relative to the current directory) or sqlite:////ABSOLUTE/FILE (absolute), or "
        "postgresql://USER@HOST:PORT/DB"
    )
    assert raised.value.reason == "bad_settings"


def test_a_one_shot_process_waits_briefly_for_its_one_connection() -> None:
    """Given a PostgreSQL URL, then a CLI command's pool is one connection with a short wait, and a
    long-running process keeps its pool and the library's long wait."""
    settings = StoreSettings.resolve("postgresql://baton@db/ledger?pool_size=4")

    one_shot = settings.env(create_table=False, one_shot=True)
    serving = settings.env(create_table=False)

    assert (one_shot["POSTGRES_POOL_SIZE"], one_shot["POSTGRES_MAX_OVERFLOW"]) == ("1", "1")
    assert float(one_shot["POSTGRES_CONNECT_TIMEOUT"]) < 5
    assert serving["POSTGRES_POOL_SIZE"] == "4"
    assert float(serving["POSTGRES_CONNECT_TIMEOUT"]) >= 30


@pytest.mark.parametrize(
    ("libpq_says", "cause"),
    [
        (
            'connection to server at "db.example" (10.0.0.5), port 5432 failed: Connection refused',
            "connection refused (is PostgreSQL running and listening on db.example:5432?)",
        ),
        (
            'could not translate host name "db.example" to address: Name or service not known',
            "host db.example not found (check the host name)",
        ),
        (
            'connection to server at "db.example", port 5432 failed: FATAL:  password authentication failed'
            ' for user "baton"',
            "authentication failed for user baton (check the user name and password)",
        ),
        (
            'connection to server at "db.example", port 5432 failed: fe_sendauth: no password supplied',
            "authentication failed: the server wants a password for user baton and the URL gives none",
        ),
        (
            'connection to server at "db.example", port 5432 failed: FATAL:  database "ledger" does not exist',
            "database ledger does not exist (create it first: baton store init makes tables, not databases)",
        ),
        (
            'connection to server at "db.example", port 5432 failed: timeout expired',
            "timed out: no answer from db.example:5432 within 2 s (is the host up, or a firewall dropping packets?)",
        ),
        ("something libpq never said before", "something libpq never said before"),
    ],
)
def test_libpq_failures_read_as_their_cause(libpq_says: str, cause: str) -> None:
    assert postgres_cause(psycopg.OperationalError(libpq_says), PARAMS, 2) == cause
