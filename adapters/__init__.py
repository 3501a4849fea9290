"""Everything with I/O: the event store, settings, the CLI and (later) the bus."""
