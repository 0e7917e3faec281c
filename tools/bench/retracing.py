"""Section 4: traces and compile seconds as the micro-batch changes.

The same micro-step body (edgebatch.training.steps.AccumulatingSteps._micro_step) wrapped three
ways, so that only the wrapping differs:
- `edgebatch`: fit's own step, an input signature whose batch dimension is None;
- `naive`: `tf.function` without a signature (a new concrete function per new batch size);
- `reduce_retracing`: `tf.function(reduce_retracing=True)` (relaxes shapes after a retrace).
Each is called with the sizes a governor produces (halvings after OOMs, regrowth after calm).
Compile seconds of a call that traced = its seconds - the seconds of an immediate second call at the
same size (the step itself).
"""

from __future__ import annotations

import time

from harness import Deadline, Mode, log, ratio_stat, stat_of

# A governor's micro-batch sizes over a run: OOM halvings, regrowth, model-guided sizes.
SIZES = (64, 32, 16, 32, 64, 48, 24, 12)
VARIANTS = ("edgebatch", "naive", "reduce_retracing")


def _make_steps(model_name: str):
    import keras
    import tensorflow as tf

    from edgebatch.training.steps import AccumulatingSteps
    from edgebatch.models.zoo import build_model, parse_model_spec

    model = build_model(parse_model_spec(model_name))
    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    element_spec = (tf.TensorSpec(shape, tf.float32), tf.TensorSpec((), tf.int32))
    steps = AccumulatingSteps(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                              keras.optimizers.Adam(1e-3), element_spec)
    biggest = max(SIZES)
    x = tf.random.uniform((biggest, *shape))
    y = tf.random.uniform((biggest,), 0, int(model.outputs[0].shape[-1]), tf.int32)
    return steps, x, y


def run_variant(variant: str, steps, x, y) -> dict:
    import tensorflow as tf

    if variant == "edgebatch":
        function = steps.micro_step
    elif variant == "naive":
        function = tf.function(steps._micro_step)
    else:
        function = tf.function(steps._micro_step, reduce_retracing=True)
    update_examples = tf.constant(float(max(SIZES)))
    compile_seconds, total_seconds = 0.0, 0.0
    for size in SIZES:
        xs, ys = x[:size], y[:size]
        before = function.experimental_get_tracing_count()
        started = time.perf_counter()
        function(xs, ys, update_examples).numpy()
        seconds = time.perf_counter() - started
        total_seconds += seconds
        if function.experimental_get_tracing_count() > before:
            started = time.perf_counter()
            function(xs, ys, update_examples).numpy()
            compile_seconds += max(0.0, seconds - (time.perf_counter() - started))
    steps.reset_accumulators()
    return {"traces": function.experimental_get_tracing_count(), "compile_seconds": compile_seconds,
            "seconds": total_seconds}


def run(mode: Mode, deadline: Deadline, end: float) -> dict:
    model_name = "mlp" if mode.quick else "small_cnn"
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for repeat in range(mode.repeats):
        if repeat and deadline.until(end) < 0:
            break
        steps, x, y = _make_steps(model_name)  # a fresh model per repeat: nothing traced yet
        for variant in VARIANTS:
            runs[variant].append(run_variant(variant, steps, x, y))
    log("retracing: " + ", ".join(f"{v} {runs[v][-1]['traces']} traces" for v in VARIANTS if runs[v]))
    base = runs["edgebatch"]
    return {
        "model": model_name,
        "sizes": list(SIZES),
        "repeats": len(base),
        "variants": {
            v: {
                "traces": stat_of([r["traces"] for r in runs[v]]),
                "compile_seconds": stat_of([r["compile_seconds"] for r in runs[v]]),
                "seconds": stat_of([r["seconds"] for r in runs[v]]),
                "seconds_vs_edgebatch": ratio_stat([r["seconds"] for r in runs[v]], [r["seconds"] for r in base]),
            }
            for v in VARIANTS
        },
    }
