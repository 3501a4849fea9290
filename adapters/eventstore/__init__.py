"""The event store: eventsourcing 9.5.6 with fenced recorders for SQLite and PostgreSQL."""

from baton.adapters.eventstore.ledger import RunLedger, submission_digest

__all__ = ["RunLedger", "submission_digest"]
