"""The `edgebatch` command: every click command lives in this package, and the library never imports it.

root.py (the group; probe, devices, profile), profile_text.py (a profile as text), supervise.py,
fleet.py (the lazy `fleet` group) with fleet_probe.py, fleet_report.py and fleet_plan.py,
probe_options.py (the search options `probe` and `fleet probe` share) and errors.py (exit codes,
Ctrl-C and SIGTERM). Importing it imports neither TensorFlow nor Ray, so `edgebatch --help` is instant.
"""

from edgebatch.cli.root import main

__all__ = ["main"]
