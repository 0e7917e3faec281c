"""Micro-batches by length against one ceiling for every length (issue 14, item 3), on real text.

Not part of the test suite. The model is the zoo's `transformer_tiny` (Keras 3). The data are the
standard library's docstrings (edgebatch.text.docstrings, training split, at most 512 tokens).
Adam, EPOCHS epochs per run, this machine's CPU.

1. Probe `transformer_tiny` per length (`edgebatch.probe(..., seq_lens=LENGTHS)`) under
   `--budget-mib` of resident memory. The profile goes to a temporary directory and is not kept.
2. Train with `edgebatch.fit` in a fresh process per run, the arms taking turns:
   - `one ceiling`: every piece at most the safe batch of the longest probed length. Without
     per-length ceilings this is the only safe micro-batch: any piece may hold the longest examples.
   - `length ceilings`: `fit(..., length_ceilings=profile)`, pieces cut by length.
   - `tokens`: as `length ceilings`, plus `batch_unit="tokens"`. The effective batch is the same
     number of real tokens per update as the other arms' mean, counted in tokens.
   Each run reports real tokens/s over its training seconds (the first update left out: it
   traces), its pieces per update, and its resident peak (VmHWM) against the budget.

The probe's trial runs a bare training step. fit's process also holds the dataset, the read-ahead
and one gradient accumulator per weight, so its peak is compared with the budget, not assumed.

    python tools/bench/length_ceilings_bench.py --benchmarks-md BENCHMARKS.md
    python tools/bench/length_ceilings_bench.py --from-json tools/bench/results/length_ceilings.json --benchmarks-md BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS_DIR, ROOT, environment, load_average, log, publish_section, write_json

SECTION_START = "<!-- length_ceilings_bench:start -->"
SECTION_END = "<!-- length_ceilings_bench:end -->"
LENGTHS = (64, 128, 256, 512)
MAX_TOKENS = 512
ARMS = ("one ceiling", "length ceilings", "tokens")
EPOCHS = 3
CHILD_TIMEOUT_SECONDS = 900


def corpus():
    from edgebatch.text.docstrings import Vocabulary, encode_corpus, load_docstrings, split
    from edgebatch.models.text import VOCABULARY_SIZE

    loaded = load_docstrings()
    train, _ = split(loaded)
    vocabulary = Vocabulary.build(train.texts, max_size=VOCABULARY_SIZE)
    return encode_corpus(train, vocabulary, MAX_TOKENS), train.labels.astype("int64"), loaded.fingerprint


def child(arm: str, profile_path: str, effective: int, token_budget: int) -> dict:
    """One training run in this (fresh) process; its JSON goes to stdout."""
    import keras
    import tensorflow as tf

    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.profiles import load_profile
    from edgebatch.sensors.host import process_peak_rss_bytes
    from edgebatch.models.text import transformer_tiny
    from edgebatch.training import LengthCeilings, fit

    tokens, labels, _ = corpus()
    profile = load_profile(profile_path)
    ceilings = LengthCeilings.from_profile(profile)
    keras.utils.set_random_seed(0)
    model = transformer_tiny(keras)
    data = tf.data.Dataset.from_generator(lambda: zip(tokens, labels), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)))
    options = {}
    if arm == "one ceiling":
        longest = ceilings.table[-1][1]
        governor = Governor(GovernorConfig(ceiling_batch=longest, effective_batch=effective, slow_step_factor=1e9))
        options = {"effective_batch": effective}
    else:
        budget = token_budget if arm == "tokens" else effective
        governor = Governor(GovernorConfig(ceiling_batch=ceilings.reference_ceiling, effective_batch=budget,
                                           slow_step_factor=1e9))
        options = {"effective_batch": budget, "length_ceilings": ceilings}
        if arm == "tokens":
            options["batch_unit"] = "tokens"
    report = fit(model, data, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 optimizer=keras.optimizers.Adam(1e-3), governor=governor, epochs=EPOCHS, **options)
    real = sum(record.tokens for record in report.updates[1:])
    seconds = sum(record.seconds for record in report.updates[1:])
    return {
        "tokens_per_second": real / seconds, "seconds": seconds, "updates": len(report.updates),
        "pieces_per_update": statistics.mean(len(r.micro_batches) for r in report.updates),
        "largest_piece": max(max(r.micro_batches) for r in report.updates),
        "examples_per_update": [min(r.examples for r in report.updates), max(r.examples for r in report.updates)],
        "oom_events": len(report.oom_events), "peak_bytes": process_peak_rss_bytes(),
    }


def run_child(arm: str, profile_path: Path, effective: int, token_budget: int) -> dict:
    command = [sys.executable, __file__, "--child", arm, "--profile", str(profile_path),
               "--effective-batch", str(effective), "--token-budget", str(token_budget)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECONDS, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{arm} run failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return {**json.loads(lines[-1]), "process_seconds": round(time.perf_counter() - started, 1)}


def measure(args) -> dict:
    from edgebatch.probing import probe
    from edgebatch.profiles import save_profile

    tokens, _, fingerprint = corpus()
    lengths = [len(t) for t in tokens]
    token_budget = round(args.effective_batch * statistics.mean(lengths))
    budget_bytes = args.budget_mib * 2**20
    data = {"environment": environment(), "load_average_start": load_average(), "corpus": fingerprint,
            "examples": len(tokens), "effective_batch": args.effective_batch, "token_budget": token_budget,
            "budget_bytes": budget_bytes, "repeats": args.repeats, "epochs": EPOCHS, "runs": []}
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        profile = probe("transformer_tiny", device="CPU:0", memory_budget=budget_bytes, seq_lens=LENGTHS,
                        trial_seconds=args.trial_seconds, profiles_dir=scratch, save=False, progress=log)
        data["probe_seconds"] = round(time.perf_counter() - started, 1)
        data["per_length"] = {length: {"max_batch": c.max_batch, "safe_batch": c.safe_batch}
                              for length, c in sorted(profile.per_length.items())}
        profile_path = save_profile(profile, Path(scratch) / "profiles")
        for repeat in range(args.repeats):
            order = ARMS[repeat % len(ARMS):] + ARMS[: repeat % len(ARMS)]
            result = {}
            for arm in order:
                result[arm] = run_child(arm, profile_path, args.effective_batch, token_budget)
                log(f"repeat {repeat} {arm}: {result[arm]['tokens_per_second']:.0f} real tokens/s, "
                    f"{result[arm]['pieces_per_update']:.1f} pieces/update, peak {result[arm]['peak_bytes'] / 2**20:.0f} MiB")
            data["runs"].append(result)
    summary = {}
    for arm in ARMS:
        runs = [run[arm] for run in data["runs"]]
        summary[arm] = {
            "tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
            "pieces_per_update": statistics.median(r["pieces_per_update"] for r in runs),
            "largest_piece": max(r["largest_piece"] for r in runs),
            "peak_mib": [min(r["peak_bytes"] for r in runs) / 2**20, max(r["peak_bytes"] for r in runs) / 2**20],
            "examples_per_update": runs[0]["examples_per_update"], "updates": runs[0]["updates"],
            "oom_events": sum(r["oom_events"] for r in runs),
        }
        ratios = [run[arm]["tokens_per_second"] / run["one ceiling"]["tokens_per_second"] for run in data["runs"]]
        summary[arm]["speedup"] = [statistics.median(ratios), min(ratios), max(ratios)]
    data["summary"] = summary
    data["load_average_end"] = load_average()
    return data


def render(data: dict) -> str:
    s = data["summary"]
    budget_mib = data["budget_bytes"] / 2**20
    table = ", ".join(f"{length}: {entry['safe_batch']}" for length, entry in data["per_length"].items())
    lines = [
        SECTION_START, "",
        "## 12. Micro-batches by length against one ceiling (issue 14, item 3)", "",
        f"`python tools/bench/length_ceilings_bench.py` (commit {data['environment'].get('git_commit')}; load average "
        f"{data['load_average_start']} before, {data['load_average_end']} after). `transformer_tiny` probed per length "
        f"under {budget_mib:.0f} MiB ({data['probe_seconds']:.0f} s), then trained for {data.get('epochs', 1)} epoch(s) on the standard "
        f"library's docstrings ({data['corpus']}, {data['examples']} texts, at most {MAX_TOKENS} tokens), each run in "
        f"a fresh process, {data['repeats']} repeats with the arms taking turns. Safe batch per length (tokens: "
        f"examples): {table}. Updates take {data['effective_batch']} examples; the tokens arm takes "
        f"{data['token_budget']} real tokens per update ({data['effective_batch']} x the mean length). How it is made: the "
        "docstring of the script.", "",
        "| arm | updates | examples per update | pieces per update (median) | largest piece | real tokens/s (median) "
        "| x one ceiling (median, min..max) | resident peak, MiB | OOMs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        a = s[arm]
        low, high = a["examples_per_update"]
        speed = a["speedup"]
        lines.append(
            f"| {arm} | {a['updates']} | {low}..{high} | {a['pieces_per_update']:.1f} | {a['largest_piece']} | "
            f"{a['tokens_per_second']:.0f} | {speed[0]:.2f} ({speed[1]:.2f}..{speed[2]:.2f}) | "
            f"{a['peak_mib'][0]:.0f}..{a['peak_mib'][1]:.0f} of {budget_mib:.0f} | {a['oom_events']} |"
        )
    over = [arm for arm in ARMS if s[arm]["peak_mib"][1] > budget_mib]
    one, by_length = s["one ceiling"], s["length ceilings"]
    lines += [
        "",
        ("Every run's resident peak stayed under the budget." if not over else
         f"**Over the budget**: {', '.join(over)} (the probe's trial is a bare step; fit holds more)."),
        f"With ceilings by length an update ran in {by_length['pieces_per_update']:.1f} pieces where one ceiling "
        f"needed {one['pieces_per_update']:.1f}, for {by_length['speedup'][0]:.2f}x the real tokens/s: on this CPU, "
        "fewer and larger pieces save little time. What they change is where memory goes: with one ceiling, pieces "
        f"of the longest examples took the process to {one['peak_mib'][1] / budget_mib:.0%} of the budget "
        "(fit holds a gradient accumulator and its data beside the probe's bare step); with pieces sized by their "
        f"own length it peaked at {by_length['peak_mib'][1] / budget_mib:.0%}.",
        "", SECTION_END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mib", type=int, default=1536)
    parser.add_argument("--effective-batch", type=int, default=256)
    parser.add_argument("--token-budget", type=int, default=0)
    parser.add_argument("--trial-seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--benchmarks-md", type=Path)
    parser.add_argument("--from-json", type=Path)
    parser.add_argument("--child", choices=ARMS)
    parser.add_argument("--profile")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.profile, args.effective_batch, args.token_budget)))
        return
    if args.from_json:
        data = json.loads(args.from_json.read_text())
    else:
        data = measure(args)
        write_json(RESULTS_DIR / "length_ceilings.json", data)
    publish_section(render(data), args.benchmarks_md, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
