"""Unit tests of the pure projections (replay prefix and cursor, portable state, resumability)."""
