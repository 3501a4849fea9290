"""Unit tests of the pure domain."""
