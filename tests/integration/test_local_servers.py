"""The local PostgreSQL harness itself works: the other integration tests rely on it."""

from __future__ import annotations

import psycopg

from tests.support.local_servers import LocalPostgres


def test_server_accepts_connections(postgres_server: LocalPostgres) -> None:
    for conninfo in (postgres_server.url(), postgres_server.dsn()):
        with psycopg.connect(conninfo) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            assert conn.execute("show fsync").fetchone() == ("on",)


def test_databases_are_independent(postgres_server: LocalPostgres, postgres_url: str) -> None:
    other_url = postgres_server.create_database("t_independence_other")
    try:
        assert other_url != postgres_url
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("create table only_here (id int primary key)")
            assert conn.execute("select to_regclass('only_here')").fetchone() == ("only_here",)
        with psycopg.connect(other_url) as conn:
            assert conn.execute("select to_regclass('only_here')").fetchone() == (None,)
    finally:
        postgres_server.drop_database("t_independence_other")


def test_warm_wal_leaves_recycled_segments_ahead_and_no_table(postgres_server: LocalPostgres) -> None:
    """Given the session's server, when 64 MiB of WAL is warmed, then at least three 16 MiB segments
    lie ahead of the current one (recycled, so later commits create none), and the table that wrote
    them is gone."""
    segments = postgres_server.warm_wal(64)

    with psycopg.connect(postgres_server.dsn(), autocommit=True) as conn:
        ahead = conn.execute(
            "SELECT count(*) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$' "
            "AND name > pg_walfile_name(pg_current_wal_lsn())"
        ).fetchone()
        leftover = conn.execute("SELECT to_regclass('baton_warm_wal')").fetchone()
    assert ahead is not None and ahead[0] >= 3
    assert segments >= 4
    assert leftover == (None,)
