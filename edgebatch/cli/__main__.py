"""`python -m edgebatch.cli` is the `edgebatch` command, as `python -m edgebatch` is."""

from edgebatch.cli import main

main()
