"""The fleet: probe every device of a Ray cluster, compare the profiles, plan a mixed fleet.

cluster.py (the Ray driver: one probe task per node), remote.py (what a node runs), nodes.py
(pure: targets, labels, the results table); `fleet report`: report.py (pure: analyse) with
report_records.py, report_read.py (the I/O), report_flags.py, report_output.py and report_html.py;
`fleet plan` (pure): plan.py (the solver) with plan_model.py and plan_records.py. train.py trains
a fleet on Ray. Importing this package imports neither Ray nor TensorFlow.
"""

from edgebatch.fleet.cluster import FleetError, fleet_probe

__all__ = ["FleetError", "fleet_probe"]
