"""`python -m dlc.cli`: the same as the `dlc` command."""

from dlc.cli.app import main

main()
