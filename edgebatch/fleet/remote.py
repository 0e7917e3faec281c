"""What runs on each node of a fleet probe: probe its devices one after another, send progress home.

This function is shipped to a node as a Ray task (cluster.py wraps it); it imports nothing from Ray
itself, so it is plain Python that a test could call directly. It does not save anything: the
profiles travel back to the driver, which writes them where the operator asked (a node may have no
access to that directory, and one writer keeps the collection in one place).

The node's own budget: a node whose environment sets EDGEBATCH_MEMORY_BUDGET (for example
`EDGEBATCH_MEMORY_BUDGET=6GiB ray start ...`) probes under it unless the fleet probe was given
`--memory-budget`, which applies to every node; the same precedence as `edgebatch probe`, whose
`--memory-budget` also reads that variable.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgebatch.probing.budget import MEMORY_BUDGET_ENV


@dataclass(frozen=True)
class ShippedModel:
    """A FILE.py or FILE.keras model read on the driver and travelling with each node's task, so it
    need not exist on the nodes. Only the file itself: modules a FILE.py imports must be installed there."""

    file_name: str
    data: bytes
    function: str | None  # FILE.py's function; None for a .keras file

    def written_to(self, directory: str) -> str:
        """Write the file into `directory`; the model spec that names it there."""
        path = Path(directory) / self.file_name
        path.write_bytes(self.data)
        return str(path) if self.function is None else f"{path}:{self.function}"


def ship_model(model_spec: str) -> ShippedModel | None:
    """The model file to send with the tasks, or None for a built-in name; a UsageError here, on the
    driver, for a name or file that does not exist (before any node spends time on it)."""
    from edgebatch.models.zoo import parse_model_spec

    spec = parse_model_spec(model_spec)
    if spec.path is None:
        return None
    path = Path(spec.path)
    return ShippedModel(path.name, path.read_bytes(), spec.function)


def node_budget(explicit: str | int | None) -> tuple[str | int | None, str]:
    """The budget this node probes under, and where it came from (for the progress line)."""
    if explicit is not None:
        return explicit, "--memory-budget"
    from_env = os.environ.get(MEMORY_BUDGET_ENV, "").strip()
    if from_env:
        return from_env, f"${MEMORY_BUDGET_ENV} on the node"
    return None, "the device default"


def probe_devices(
    model_spec: str,
    devices: tuple[str, ...],
    options: dict,
    send: Callable[[str, str], None],
    node_label: str | None = None,
    shipped: ShippedModel | None = None,
) -> list[dict]:
    """Probe each device in turn; one result dict per device, never an exception for a failed probe.

    `options` are edgebatch.probe's keyword options (memory_budget, precision, ...) minus device.
    `send(device, line)` carries a progress line to the driver. A result is
    {"device", "ok", "seconds", "profile" (a profile dict, with `node_label`, else this machine's
    hostname, added under device.host: what fleet reports and plans tell devices apart by)} or
    {"device", "ok": False, "seconds", "error": one line}. With `shipped`, the model file is
    written to a temporary directory here and probed from there.
    """
    if shipped is None:
        return _probe_each(model_spec, devices, options, send, node_label)
    with tempfile.TemporaryDirectory(prefix="edgebatch-model-") as directory:
        return _probe_each(shipped.written_to(directory), devices, options, send, node_label)


def _probe_each(model_spec: str, devices: tuple[str, ...], options: dict, send: Callable[[str, str], None],
                node_label: str | None) -> list[dict]:
    from edgebatch.errors import EdgebatchError
    from edgebatch.probing import probe

    budget, budget_source = node_budget(options.get("memory_budget"))
    options = {**options, "memory_budget": budget}
    hostname = socket.gethostname()
    host = node_label or hostname
    results = []
    for device in devices:
        started = time.monotonic()
        send(device, f"probing {model_spec} on {hostname} {device}, budget from {budget_source}")
        try:
            profile = probe(
                model_spec,
                device=device,
                save=False,
                force=True,
                progress=lambda line, device=device: send(device, line),
                **options,
            )
        except EdgebatchError as error:
            results.append(_failure(device, started, str(error)))
            continue
        except Exception as error:  # a bug or an environment problem on one node must not hide the others
            results.append(_failure(device, started, f"{type(error).__name__}: {error}"))
            continue
        data = profile.to_dict()
        data["device"] = {**data["device"], "host": host}
        results.append({"device": device, "ok": True, "seconds": time.monotonic() - started, "profile": data})
    return results


def _failure(device: str, started: float, message: str) -> dict:
    first_line = message.strip().splitlines()[0] if message.strip() else "failed without a message"
    return {"device": device, "ok": False, "seconds": time.monotonic() - started, "error": first_line}
