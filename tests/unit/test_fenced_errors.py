"""Driver errors become the library's own, by their PEP 249 name, for both stores' appends."""

from __future__ import annotations

import sqlite3
from types import ModuleType

import eventsourcing.persistence as library
import psycopg
import pytest
from psycopg import errors as pg_errors

from baton.adapters.eventstore.fenced import library_error_class

# PEP 249's error classes, as the standard library's driver defines them
NAMES = sorted(
    name
    for name, value in vars(sqlite3).items()
    if isinstance(value, type) and issubclass(value, sqlite3.Error) and value is not sqlite3.Error
)


@pytest.mark.parametrize("driver", [sqlite3, psycopg], ids=["sqlite3", "psycopg"])
@pytest.mark.parametrize("name", NAMES)
def test_a_driver_error_becomes_the_library_error_of_its_name(driver: ModuleType, name: str) -> None:
    """Given a driver's error of a PEP 249 class, when mapped, then the library's class of that name."""
    error = getattr(driver, name)("boom")

    assert library_error_class(error, driver) is getattr(library, name)


def test_a_subclass_maps_as_its_pep_249_base_and_anything_else_as_the_root() -> None:
    """Given a unique violation (an ``IntegrityError``) and a plain ``sqlite3.Error``, when mapped,
    then ``IntegrityError`` and ``PersistenceError``."""
    assert library_error_class(pg_errors.UniqueViolation("dup"), psycopg) is library.IntegrityError
    assert library_error_class(sqlite3.Error("other"), sqlite3) is library.PersistenceError
