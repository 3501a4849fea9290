"""A store that cannot be used, as an operator meets it (issue 31): the real ``baton`` in a subprocess
against a real PostgreSQL and real files says why in one sentence, within seconds, with the URL
shown without its password, and exits 3 (unavailable) or 2 (a URL that is not one)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from test_cli import baton

from tests.support.local_servers import LocalPostgres

FAIL_WITHIN_S = 5.0  # the bound, a process start included


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def timed(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    started = time.monotonic()
    result = baton(cwd, *args, env=env)
    assert result.stdout == ""
    return result.returncode, result.stderr, time.monotonic() - started


def on_socket(server: LocalPostgres, user: str, dbname: str) -> str:
    return server.url(dbname).replace("postgresql://postgres@", f"postgresql://{user}:s3cret@", 1)


def test_a_refused_port_fails_fast_naming_host_port_and_never_the_password(tmp_path: Path) -> None:
    """Given a PostgreSQL URL whose port refuses connections, when a command opens it, then it exits 3
    within 5 s saying the connection was refused at that host and port, without the password."""
    port = closed_port()

    code, said, took = timed(tmp_path, "runs", "--store", f"postgresql://baton:s3cret@127.0.0.1:{port}/baton")

    assert code == 3
    assert took < FAIL_WITHIN_S
    assert said == (
        f"baton: cannot connect to postgresql://baton@127.0.0.1:{port}/baton: connection refused "
        f"(is PostgreSQL running and listening on 127.0.0.1:{port}?)\n"
    )


def test_a_missing_database_and_an_unknown_role_are_named(tmp_path: Path, postgres_server: LocalPostgres) -> None:
    """Given a running server, when a command names a database or a user it does not have, then it
    exits 3 within 5 s naming the missing one."""
    missing_db = timed(tmp_path, "runs", "--store", on_socket(postgres_server, "postgres", "no_such_db"))
    missing_role = timed(tmp_path, "runs", "--store", on_socket(postgres_server, "nobody", "postgres"))

    for code, said, took in (missing_db, missing_role):
        assert code == 3
        assert took < FAIL_WITHIN_S
        assert "s3cret" not in said
    assert "database no_such_db does not exist" in missing_db[1]
    assert "authentication failed: user nobody does not exist" in missing_role[1]


def test_an_uninitialised_database_names_store_init(tmp_path: Path, postgres_url: str) -> None:
    """Given an empty database, when a command opens it, then it exits 3 naming ``baton store init``."""
    code, said, took = timed(tmp_path, "runs", "--store", postgres_url)

    assert code == 3
    assert took < FAIL_WITHIN_S
    assert "baton store init" in said


def test_a_sqlite_file_in_a_missing_directory_is_named_by_its_resolved_path(tmp_path: Path) -> None:
    """Given sqlite:/// with a relative path into a directory that does not exist, when a command opens
    it, then it exits 3 naming the absolute path it resolved to and the missing directory."""
    code, said, _ = timed(tmp_path, "runs", "--store", "sqlite:///nowhere/x.db")

    assert code == 3
    assert said == (
        f"baton: cannot open the SQLite store {tmp_path}/nowhere/x.db (directory {tmp_path}/nowhere does not exist)\n"
    )


def test_three_slashes_are_relative_to_the_working_directory(tmp_path: Path) -> None:
    """Given sqlite:///tmp-like/x.db where only the absolute directory exists, when a command opens
    it, then the message says three slashes are relative and shows the four-slash form."""
    absolute_dir = tmp_path / "abs"
    absolute_dir.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    url = f"sqlite:///{str(absolute_dir).lstrip('/')}/x.db"

    code, said, _ = timed(cwd, "runs", "--store", url)

    assert code == 3
    assert f"for {absolute_dir}/x.db write sqlite:///{absolute_dir}/x.db" in said


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("/tmp/x.db", "--store /tmp/x.db is not a store URL: use sqlite:////tmp/x.db (absolute)"),
        ("sqlite://tmp/x.db", "names a host (tmp), which a SQLite store has none of"),
        ("sqlite:", "names no file"),
        ("mysql://h/db", "Baton knows no mysql:// stores"),
        ("postgresql://u:pw@h:port/db", "--store postgresql://u@h:port/db has a port that is not a number"),
    ],
)
def test_a_store_url_that_is_not_one_is_a_usage_error_in_one_sentence(tmp_path: Path, url: str, says: str) -> None:
    """Given a malformed store URL, when any command gets it, then it exits 2 with one line that says
    what is wrong and what to write instead: no pydantic report, no password."""
    code, said, _ = timed(tmp_path, "runs", "--store", url)

    assert code == 2
    assert says in said
    assert said.count("\n") == 1
    assert "validation error" not in said
    assert "pw@" not in said


def test_a_bad_baton_store_variable_is_named_as_the_source(tmp_path: Path) -> None:
    """Given BATON_STORE set to a bare path, when a command runs, then the message names BATON_STORE."""
    code, said, _ = timed(tmp_path, "runs", env={"BATON_STORE": "x.db"})

    assert code == 2
    assert said.startswith("baton: BATON_STORE x.db is not a store URL")


def test_a_password_in_the_query_is_not_shown(tmp_path: Path) -> None:
    """Given the password as a query parameter, when the connection fails, then it is not shown."""
    port = closed_port()
    url = f"postgresql://baton@127.0.0.1:{port}/baton?password={quote('p@ss')}&sslmode=disable"

    code, said, _ = timed(tmp_path, "runs", "--store", url)

    assert code == 3
    assert "p%40ss" not in said
    assert f"postgresql://baton@127.0.0.1:{port}/baton?sslmode=disable" in said
