"""`python -m queuectl.cli`: the `queuectl` command."""

from queuectl.cli import main

main()
