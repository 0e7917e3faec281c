"""The fleet: probe every device of a Ray cluster, compare the profiles, plan a mixed fleet.

cluster.py (the Ray driver: one probe task per node), remote.py (what a node runs), nodes.py
(pure: targets, labels, the results table), report.py and report_html.py (`fleet report`),
plan.py (pure: `fleet plan`). Importing this package imports neither Ray nor TensorFlow.
"""

from edgebatch.fleet.cluster import FleetError, fleet_probe

__all__ = ["FleetError", "fleet_probe"]
