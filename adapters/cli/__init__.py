"""``baton``: a thin command line over the ledger, one module per command group.

Each command decodes its input, calls the ledger and prints; errors map to exit codes in one
table (``app.EXIT_CODES``). Without ``--store`` (and without ``BATON_STORE``) every command uses
the embedded default, the SQLite file ``baton.db`` in the current directory.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from baton.adapters.cli import audit, demo, handoff, identity, purge, runs, serve, store, submit, views
from baton.adapters.cli.app import EXIT_CODES, EXIT_TABLE, Exit, Failed, root

__all__ = ["EXIT_CODES", "EXIT_TABLE", "Exit", "main", "root"]

for _module in (store, identity, demo, submit, runs, audit, handoff, views, serve, purge):
    for _command in _module.COMMANDS:
        root.add_command(_command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``baton ARGV`` (default: the process's arguments) and return its exit code."""
    try:
        code = root.main(list(argv) if argv is not None else None, prog_name="baton", standalone_mode=False)
    except Failed as exc:  # a command that could not run
        exc.show()
        return exc.code
    except click.ClickException as exc:  # a usage error (2)
        exc.show()
        return exc.exit_code
    except click.Abort:  # Ctrl-C or end of input at a prompt
        return Exit.INTERRUPTED
    return code if isinstance(code, int) else 0
