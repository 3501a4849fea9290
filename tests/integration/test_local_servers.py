"""The local PostgreSQL harness itself works: the other integration tests rely on it."""

from __future__ import annotations

import psycopg

from adapters.local_servers import LocalPostgres


def test_server_accepts_connections(postgres_server: LocalPostgres) -> None:
    for conninfo in (postgres_server.url(), postgres_server.dsn()):
        with psycopg.connect(conninfo) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            assert conn.execute("show fsync").fetchone() == ("on",)


def test_databases_are_independent(postgres_server: LocalPostgres, postgres_url: str) -> None:
    other_url = postgres_server.create_database("t_independence_other")
    assert other_url != postgres_url
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("create table only_here (id int primary key)")
        assert conn.execute("select to_regclass('only_here')").fetchone() == ("only_here",)
    with psycopg.connect(other_url) as conn:
        assert conn.execute("select to_regclass('only_here')").fetchone() == (None,)
