"""What the renderers of `edgebatch fleet report` share: ages in words and the `--json` form.

The text table (cli/fleet_report.py) and the HTML page (report_html.py) format ages with
`format_age`; `report_to_dict` is what `--json` prints. Pure: data in, data out; strings from
profiles are passed through as they are (escaping is each medium's job).
"""

from __future__ import annotations

from typing import Any

from edgebatch.fleet.report_records import FleetReport, ProfileRow


def format_age(age_seconds: float) -> str:
    """'45 s', '12 min', '5 h', '3 d' (whole units, rounded down); 'in the future' when negative."""
    if age_seconds < 0:
        return "in the future"
    for unit, seconds in (("d", 86400), ("h", 3600), ("min", 60)):
        if age_seconds >= seconds:
            return f"{int(age_seconds // seconds)} {unit}"
    return f"{int(age_seconds)} s"


def report_to_dict(report: FleetReport) -> dict[str, Any]:
    """The report as JSON-ready data (what `--json` prints). Sizes in bytes, ages in seconds."""
    return {
        "generated_at": report.generated_at,
        "running": {
            "schema_version": report.running.schema_version,
            "edgebatch": report.running.edgebatch,
            "tensorflow": report.running.tensorflow,
        },
        "rows": [_row_dict(row) for row in report.rows],
        "matrix": {
            "devices": [
                {"host": host, "device_fingerprint": fingerprint, "device_description": description}
                for host, fingerprint, description in report.matrix_devices
            ],
            "models": [{"model_key": key, "model_name": name} for key, name in report.matrix_models],
            "safe_batch": [
                [list(report.matrix_cells.get(((host, fingerprint), key), ())) for key, _name in report.matrix_models]
                for host, fingerprint, _description in report.matrix_devices
            ],
        },
        "duplicates": [
            {"device_fingerprint": g.device_fingerprint, "model_key": g.model_key, "host": g.host,
             "sources": list(g.sources), "identical": g.identical}
            for g in report.duplicates
        ],
        "outliers": [
            {"device_fingerprint": g.device_fingerprint, "model_key": g.model_key, "model_name": g.model_name,
             "spread_fraction": g.spread_fraction, "budgets_differ": g.budgets_differ,
             "members": [{"host": m.host, "max_batch": m.max_batch, "budget_bytes": m.budget_bytes,
                          "source": m.source} for m in g.members]}
            for g in report.outliers
        ],
        "invalid": [{"source": item.source, "error": item.error} for item in report.invalid],
    }


def _row_dict(row: ProfileRow) -> dict[str, Any]:
    rate = row.throughput_at_safe
    return {
        "source": row.source,
        "host": row.host,
        "host_source": row.host_source,
        "ray_node_id": row.ray_node_id,
        "device_fingerprint": row.device_fingerprint,
        "device_description": row.device_description,
        "device_kind": row.device_kind,
        "tf_device": row.tf_device,
        "model_name": row.model_name,
        "model_key": row.model_key,
        "budget_bytes": row.budget_bytes,
        "headroom": row.headroom,
        "measure": row.measure,
        "max_batch": row.max_batch,
        "safe_batch": row.safe_batch,
        "throughput_knee": row.throughput_knee,
        "samples_per_second_at_safe_batch": rate.samples_per_second,
        "samples_per_second_basis": rate.basis,
        "samples_per_second_steady": rate.steady,
        "unsteady_batches": list(row.unsteady_batches),
        "memory_fixed_bytes": row.memory_fixed_bytes,
        "memory_per_sample_bytes": row.memory_per_sample_bytes,
        "memory_r2": row.memory_r2,
        "created_at": row.created_at,
        "age_seconds": row.age_seconds,
        "versions": {
            "schema": row.schema_version,
            "edgebatch": row.edgebatch_version,
            "tensorflow": row.tensorflow_version,
        },
        "flags": [{"kind": flag.kind, "message": flag.message} for flag in row.flags],
    }
