"""Whether this process ends with the command it runs: `dlc` itself does, a test's CliRunner does not.

Only a process that ends with its command may change how it takes signals for good (`dlc train`
after a Ctrl-C during start-up). `dlc.cli.app.main` marks it; the commands read it.
"""

from __future__ import annotations

_ends_with_command = False


def mark_ends_with_command() -> None:
    global _ends_with_command
    _ends_with_command = True


def ends_with_command() -> bool:
    return _ends_with_command
