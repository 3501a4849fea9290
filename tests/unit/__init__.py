"""Unit tests: pure code only, no I/O."""
