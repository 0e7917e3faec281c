"""`python -m edgebatch` is the `edgebatch` command."""

from edgebatch.cli import main

main()
