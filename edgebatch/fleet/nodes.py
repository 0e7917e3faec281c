"""Which nodes a fleet probe visits, what each probes, and how their results read. Pure: no Ray here.

A Ray cluster describes its nodes as dicts (`ray.nodes()`): an id, an address, whether it is
alive, and its resources (CPU, GPU, memory, custom ones). This module turns those into targets,
one per alive node, and each target into the devices its task probes: every GPU of a node with
GPUs, else its CPU. The results come back as one record per (node, device), which is what the
progress lines and the final table show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# What a node's label may contain: it names a directory, so the same characters as a profile name.
_UNSAFE_LABEL_CHARS = re.compile(r"[^a-z0-9.-]+")
NODE_ID_CHARS_IN_LABEL = 8


@dataclass(frozen=True, kw_only=True)
class NodeTarget:
    """One alive node of the cluster and what its probe task asks for."""

    node_id: str
    address: str
    label: str
    cpus: float
    gpus: int

    @property
    def devices(self) -> tuple[str, ...]:
        """The TensorFlow devices this node's task probes, in order: each GPU, or the CPU."""
        if self.gpus > 0:
            return tuple(f"GPU:{index}" for index in range(self.gpus))
        return ("CPU:0",)


@dataclass(frozen=True, kw_only=True)
class DeviceResult:
    """What one (node, device) probe ended with: a saved profile, or the error that stopped it."""

    label: str
    device: str
    ok: bool
    max_batch: int | None = None
    safe_batch: int | None = None
    profile_location: str | None = None
    error: str | None = None
    seconds: float | None = None
    # The profile as a dict, on its way from the node to the profiles directory.
    profile: dict | None = field(default=None, repr=False, compare=False)


def node_label(address: str, node_id: str, hostname: str | None = None, *, with_id: bool = True) -> str:
    """A directory-safe name for a node: its hostname (or address), and the start of its Ray id if asked.

    The id part keeps two Ray nodes on one host apart (as in tests, or several raylets on one big
    box); without it the name stays the same across restarts of Ray, so a node's re-probe lands
    in the same directory.
    """
    base = (hostname or address or "node").lower()
    base = _UNSAFE_LABEL_CHARS.sub("-", base).strip("-.") or "node"
    if not with_id:
        return base
    suffix = re.sub(r"[^a-z0-9]+", "", node_id.lower())[:NODE_ID_CHARS_IN_LABEL] or "unknown"
    return f"{base}-{suffix}"


def targets_from_ray_nodes(nodes: list[dict]) -> list[NodeTarget]:
    """One target per alive node of `ray.nodes()`, sorted by label so the table reads the same each run.

    A node is labelled by its hostname alone when no other alive node shares it, else by hostname
    and Ray id: the label is what the report and the plan tell devices apart by.
    """
    alive = [node for node in nodes if node.get("Alive", node.get("alive", False))]
    facts = []
    for node in alive:
        resources = node.get("Resources") or {}
        node_id = str(node.get("NodeID", ""))
        address = str(node.get("NodeManagerAddress", ""))
        hostname = node.get("NodeManagerHostname") or None
        facts.append((node_id, address, hostname, resources))
    bases = [node_label(address, node_id, hostname, with_id=False) for node_id, address, hostname, _ in facts]
    targets = []
    for (node_id, address, hostname, resources), base in zip(facts, bases):
        shared = bases.count(base) > 1
        targets.append(
            NodeTarget(
                node_id=node_id,
                address=address,
                label=node_label(address, node_id, hostname, with_id=shared),
                cpus=float(resources.get("CPU", 0.0)),
                gpus=int(resources.get("GPU", 0)),
            )
        )
    return sorted(targets, key=lambda target: target.label)


def format_results(results: list[DeviceResult]) -> str:
    """The table printed at the end of a fleet probe: one row per (node, device), errors in their column."""
    header = f"{'node':<28} {'device':<7} {'max_batch':>9} {'safe_batch':>10} {'seconds':>8}  result"
    lines = [header]
    for result in sorted(results, key=lambda r: (r.label, r.device)):
        seconds = f"{result.seconds:.0f}" if result.seconds is not None else "-"
        if result.ok:
            outcome = f"saved {result.profile_location}"
            max_batch, safe_batch = str(result.max_batch), str(result.safe_batch)
            if at_batch_limit(result):
                max_batch += "*"
        else:
            outcome = f"FAILED: {result.error}"
            max_batch = safe_batch = "-"
        lines.append(f"{result.label:<28} {result.device:<7} {max_batch:>9} {safe_batch:>10} {seconds:>8}  {outcome}")
    failed = sum(1 for result in results if not result.ok)
    lines.append(f"{len(results) - failed} of {len(results)} device probes saved a profile"
                 + (f"; {failed} failed (see the result column)" if failed else ""))
    if any(result.ok and at_batch_limit(result) for result in results):
        lines.append("* the --max-batch-limit, not the device's ceiling: raise the limit to find how far it goes")
    return "\n".join(lines)


def at_batch_limit(result: DeviceResult) -> bool:
    """Whether the answer is the largest batch the search was allowed (its --max-batch-limit,
    rounded down to --multiple): the device may take more."""
    search = (result.profile or {}).get("search", {})
    limit, multiple = search.get("max_batch_limit"), search.get("multiple") or 1
    return bool(result.ok and limit and result.max_batch is not None and result.max_batch >= limit // multiple * multiple)


def node_done_line(label: str, results: list[DeviceResult]) -> str:
    """One progress line when a node's task has ended: each device's answer or error."""
    seconds = max((result.seconds or 0.0) for result in results) if results else 0.0
    parts = []
    for result in results:
        if result.ok:
            limit = " (the --max-batch-limit)" if at_batch_limit(result) else ""
            parts.append(f"{result.device} max_batch {result.max_batch}{limit}, safe_batch {result.safe_batch}")
        else:
            parts.append(f"{result.device} failed: {result.error}")
    return f"[{label}] finished after {seconds:.0f} s: " + "; ".join(parts)
