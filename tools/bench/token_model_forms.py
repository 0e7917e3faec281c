"""Refit a probe per length's readings with other token-model forms, and see what each predicts.

Reads a results file of `tools/bench/seq_len_bench.py` that kept its trial readings
(`trial_readings`, since b8a3557) and, for each form, prints the root-mean-square distance of the
readings from the fit, the ceiling it predicts at each length under the probe's fitting limit, and
how far it sits above the fresh processes' peaks (`fresh_checks`) at the lengths never probed.
The probe's own form, peak = fixed + a x B x L + b x B x L^2, is fitted by
`edgebatch.probing.token_fit.fit_token_model`; the others by plain least squares, over the same
points (`token_fit.low_level_points`: each pair at its lowest reading, less the high draws).

    python tools/bench/token_model_forms.py tools/bench/results/seq_lens_trial_readings_b8a3557.json

docs/probe-evidence.md ("Probing per sequence length") quotes its output.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from edgebatch.probing.token_fit import fit_token_model, low_level_points

MIB = 2**20
# name -> the terms besides the intercept, each a function of (batch, length).
OTHER_FORMS = {
    "fixed + c B + a BL + b BL^2": (lambda b, n: b, lambda b, n: b * n, lambda b, n: b * n * n),
    "fixed + a BL + b BL^2 + e L": (lambda b, n: b * n, lambda b, n: b * n * n, lambda b, n: n),
    "fixed + a BL + b BL^1.5": (lambda b, n: b * n, lambda b, n: b * n**1.5),
}


def least_squares(rows, terms):
    """predict(batch, length) of the least-squares fit of peak on (1, *terms)."""
    matrix = np.array([[1.0, *(term(b, n) for term in terms)] for b, n, _ in rows])
    coefficients, *_ = np.linalg.lstsq(matrix, np.array([p for _, _, p in rows]), rcond=None)
    return lambda b, n: float(coefficients[0] + sum(c * term(b, n) for c, term in zip(coefficients[1:], terms)))


def report(name, predict, rows, lengths, limit_bytes, fresh) -> None:
    rms = math.sqrt(sum((predict(b, n) - p) ** 2 for b, n, p in rows) / len(rows))
    ceilings = {n: max((b for b in range(1, 20000) if predict(b, n) <= limit_bytes), default=0) for n in lengths}
    above = {n: [round((predict(c["batch"], n) - c["peak_bytes"]) / MIB, 1) for c in fresh if c["length"] == n]
             for n in sorted({c["length"] for c in fresh})}
    print(f"{name}: RMS {rms / MIB:.1f} MiB; predicted ceilings {ceilings}")
    for n, values in above.items():
        print(f"    {n} tokens: prediction - fresh peak at the checked batches, MiB: {values}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a seq_len_bench.py results file with trial_readings")
    args = parser.parse_args()
    data = json.loads(open(args.results).read())
    if "trial_readings" not in data:
        raise SystemExit(f"{args.results} has no trial_readings: rerun tools/bench/seq_len_bench.py (b8a3557 or later)")
    # Each pair at its lowest reading, less the high draws. The probe's fit takes these points after
    # moving children's readings down by their steady lift (per_length.token_readings); on the b8a3557
    # run that lift is 7.0 MiB and moves the fit's r2 from 0.9986 to 0.9992.
    rows = low_level_points((r["batch"], r["length"], r["peak_bytes"]) for r in data["trial_readings"])
    lengths = sorted(set(data["probe_lens"]) | set(data["predict_lens"]))
    unprobed = set(data["predict_lens"]) - set(data["probe_lens"])
    fresh = [c for c in data["fresh_checks"] if c["ran"] and c["length"] in unprobed]
    truth = {row["length"]: row["truth"]["fit_limit"]["ceiling"] for row in data["rows"] if row["truth"]}
    print(f"{len(rows)} (batch, length) points from {len(data['trial_readings'])} readings at "
          f"{sorted({int(n) for _, n, _ in rows})} tokens; truth under the fitting limit {truth}")
    probe_form = fit_token_model(rows)
    report("probe's form, fixed + a BL + b BL^2", probe_form.predict_bytes, rows, lengths, data["fit_limit_bytes"],
           fresh)
    for name, terms in OTHER_FORMS.items():
        report(name, least_squares(rows, terms), rows, lengths, data["fit_limit_bytes"], fresh)


if __name__ == "__main__":
    main()
