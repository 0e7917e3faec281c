"""fit on variable-length token sequences (training/sequences.py): examples kept unpadded, sorted by
length within each update, padded per micro-batch; the result equals the plain loop that pads each
whole update, with OOMs injected, for a model that masks its padding."""

import numpy as np
import pytest

from edgebatch.errors import UsageError
from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import fit, inject_oom
from edgebatch.training.sequences import length_order, pad_rows, ragged_rows

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

VOCABULARY = 50
CLASSES = 3
EFFECTIVE = 8


def sequences(count=40, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 30, size=count)
    tokens = [rng.integers(1, VOCABULARY, size=n).astype("int32") for n in lengths]
    labels = rng.integers(0, CLASSES, size=count).astype("int64")
    return tokens, labels


def dataset(tokens, labels):
    return tf.data.Dataset.from_generator(lambda: zip(tokens, labels), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)))


def masked_model():
    """Embedding with mask_zero, masked average, dense: padding (id 0) cannot reach the logits."""
    init = keras.initializers.GlorotUniform(seed=3)
    inputs = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(VOCABULARY, 8, mask_zero=True, embeddings_initializer=init)(inputs)
    pooled = keras.layers.GlobalAveragePooling1D()(embedded)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, kernel_initializer=init)(pooled))


def plain_loop(tokens, labels, update_sizes=None):
    """One Adam step per consecutive update (EFFECTIVE examples each, or `update_sizes`), the update
    padded to its own longest sequence."""
    model, optimizer = masked_model(), keras.optimizers.Adam(0.01)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    sizes = update_sizes or [EFFECTIVE] * -(-len(tokens) // EFFECTIVE)
    for start, size in zip(np.cumsum([0, *sizes[:-1]]), sizes):
        x = pad_rows(np.array(tokens[start : start + size] + [None], dtype=object)[:-1])
        with tf.GradientTape() as tape:
            value = loss(labels[start : start + size], model(x, training=True))
        # Dense gradients, as fit's accumulators hold them: Keras 3's Adam treats an Embedding's
        # IndexedSlices with repeated ids differently from their dense sum (measured: 0.0097 apart
        # after one update of this model).
        gradients = [tf.convert_to_tensor(g) for g in tape.gradient(value, model.trainable_variables)]
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return model.get_weights()


def test_rows_pad_and_order_by_length():
    rows = ragged_rows(np.arange(6), np.array([0, 3, 3, 4, 6]))
    assert [list(r) for r in rows] == [[0, 1, 2], [], [3], [4, 5]]
    assert pad_rows(rows[[0, 3]]).tolist() == [[0, 1, 2], [4, 5, 0]]
    assert list(length_order([np.zeros(4), rows])) == [1, 2, 3, 0]
    assert length_order([np.zeros((4, 2))]) is None


@pytest.mark.parametrize("ceiling, failures", [(8, []), (3, [2]), (1, [])])
def test_variable_length_fit_equals_the_plain_padded_loop(ceiling, failures):
    tokens, labels = sequences()
    model = masked_model()
    governor = Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=EFFECTIVE))
    with inject_oom(failures):
        report = fit(model, dataset(tokens, labels), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     optimizer=keras.optimizers.Adam(0.01), effective_batch=EFFECTIVE, governor=governor)
    assert report.examples_seen == 40 and len(report.oom_events) == len(failures)
    assert report.traces["micro_step"] == 1  # one trace serves every length
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), plain_loop(tokens, labels)))
    assert diff < 1e-5


def test_the_tolerance_tells_a_lost_example_from_rounding():
    tokens, labels = sequences()
    expected = plain_loop(tokens, labels)
    changed = plain_loop(tokens[:3] + [tokens[3][:1]] + tokens[4:], labels)  # one example cut short
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(changed, expected)) > 1e-3


def test_two_ragged_axes_are_a_one_line_usage_error():
    x = tf.ragged.constant([[[1, 2], [3]], [[4]]], dtype=tf.int32)
    data = tf.data.Dataset.from_tensor_slices((x, tf.constant([0, 1], tf.int64)))
    spec_model = masked_model()
    with pytest.raises(UsageError) as error:
        fit(spec_model, data, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=keras.optimizers.SGD(0.1), effective_batch=2)
    assert "\n" not in str(error.value)


LENGTH_CEILINGS = {8: 6, 16: 3, 32: 2}


@pytest.mark.parametrize("failures", [[], [1, 4]])
@pytest.mark.parametrize("cut", ["greedy", "piece cost"])
def test_pieces_cut_by_length_ceilings_equal_the_plain_padded_loop(failures, cut):
    """Short examples run in larger pieces than long ones, none above its length's ceiling or the
    governor's share of it; the weights equal the plain loop's, OOMs injected or not, whether each
    piece is as large as it may be or the cut follows a piece cost (piece_cost.py)."""
    from edgebatch.training import LengthCeilings
    from edgebatch.training.piece_cost import PieceCost

    tokens, labels = sequences()
    ceilings = LengthCeilings.from_mapping(LENGTH_CEILINGS)
    if cut == "piece cost":  # a step costs as much as 100 tokens: pieces of short examples stay large
        ceilings = LengthCeilings(ceilings.table, piece_cost=PieceCost(1e-3, 1e-5))
    model = masked_model()
    with inject_oom(failures):
        report = fit(model, dataset(tokens, labels), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     optimizer=keras.optimizers.Adam(0.01), effective_batch=EFFECTIVE, length_ceilings=ceilings)
    assert report.examples_seen == 40 and len(report.oom_events) == len(failures)
    governor_micro_batch = 6  # the ceiling at the shortest probed length (8 tokens): the default governor's
    for record in report.updates:
        assert sum(record.micro_batches) == record.examples
        assert len(record.piece_lengths) == len(record.micro_batches)
        for size, length in zip(record.micro_batches, record.piece_lengths):
            assert size <= ceilings.piece_limit(governor_micro_batch, length, 6) <= ceilings.ceiling_at(length)
        governor_micro_batch = record.next_micro_batch
    pieces = [(size, length) for record in report.updates for size, length in zip(record.micro_batches, record.piece_lengths)]
    assert any(size > 2 for size, _ in pieces)  # short examples: more than the 2 long ones may hold
    assert all(size <= 2 for size, length in pieces if length > 16)
    if failures:
        assert report.oom_events[0].next_micro_batch < 6
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), plain_loop(tokens, labels)))
    assert diff < 1e-5


def test_fit_times_its_pieces_refits_the_piece_cost_and_cuts_by_it_exactly():
    """With a piece cost, fit times each piece, refits the cost from those times every REFIT_PIECES
    pieces (not the first update: it traces) and cuts the following updates by the refitted cost;
    the weights still equal the plain loop's."""
    from edgebatch.training import LengthCeilings
    from edgebatch.training.piece_cost import PieceCost, PieceTimes

    tokens, labels = sequences(count=240, seed=1)
    start_cost = PieceCost(1e-3, 1e-5)
    ceilings = LengthCeilings(LengthCeilings.from_mapping(LENGTH_CEILINGS).table, piece_cost=start_cost)
    model = masked_model()
    report = fit(model, dataset(tokens, labels), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 optimizer=keras.optimizers.Adam(0.01), effective_batch=EFFECTIVE, length_ceilings=ceilings)
    for record in report.updates:
        assert len(record.piece_seconds) == len(record.micro_batches) and min(record.piece_seconds) > 0
    # Replay the refits from the recorded times: the last one is the cost fit returned.
    times, refit_after, cost = PieceTimes(), None, start_cost
    for index, record in enumerate(report.updates[1:], start=1):
        times.add(record.micro_batches, record.piece_lengths, record.piece_seconds)
        refitted = times.refit()
        if refitted is not None:
            refit_after, cost = index, refitted
    assert refit_after is not None and refit_after < len(report.updates) - 1  # updates were cut by it
    assert report.piece_cost == cost != start_cost
    governor_micro_batch = 6
    for index, record in enumerate(report.updates):
        lengths = sorted(len(row) for row in tokens[index * EFFECTIVE : (index + 1) * EFFECTIVE])
        if index > refit_after:
            expected = cost.cut(lengths, lambda length: ceilings.piece_limit(governor_micro_batch, length, 6))
            assert list(record.micro_batches) == expected
        governor_micro_batch = record.next_micro_batch
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), plain_loop(tokens, labels)))
    assert diff < 1e-5


def test_an_adaptive_batch_with_length_ceilings_equals_the_plain_loop_fed_its_update_sizes():
    """adapt moves the effective batch; pieces are still cut by length, each also capped so that an
    update runs in at least min_pieces_per_update pieces (these ceilings alone would run a whole
    update of 8 in one piece); OOMs injected; the weights equal the plain loop's over the same
    consecutive updates (lr_rule 'none': the rate stays put)."""
    from edgebatch.adapt import AdaptConfig
    from edgebatch.training import LengthCeilings

    tokens, labels = sequences(count=80)
    table = {16: 10, 32: 8}  # every example (1-29 tokens) fits 8 to a piece, the short ones 10
    ceilings = LengthCeilings.from_mapping(table)
    config = AdaptConfig(check_every_updates=2, cooldown_updates=1, grow_above_cosine=-0.5, shrink_below_cosine=-0.9,
                         noise_cap_factor=None, grow_below_noise_fraction=None, cosine_window_updates=1,
                         max_effective_batch_samples=24, lr_rule="none", drift_rise=0.89)
    model = masked_model()
    with inject_oom([2, 6]):
        report = fit(model, dataset(tokens, labels), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     optimizer=keras.optimizers.Adam(0.01), effective_batch=EFFECTIVE, length_ceilings=table,
                     adapt=config)
    effective = [record.effective_batch for record in report.updates]
    assert effective[0] == EFFECTIVE and max(effective) > EFFECTIVE and report.adapt_changes
    assert report.examples_seen == 80 and len(report.oom_events) == 2
    upper = EFFECTIVE  # the default governor: ceiling 10 (the shortest length's), effective batch 8
    governor_micro_batch = upper
    for record in report.updates:
        bound = max(1, min(record.effective_batch, -(-record.effective_batch // config.min_pieces_per_update)))
        assert sum(record.micro_batches) == record.examples
        if record.examples >= config.min_pieces_per_update:
            assert len(record.micro_batches) >= config.min_pieces_per_update
        for size, length in zip(record.micro_batches, record.piece_lengths):
            assert size <= min(bound, ceilings.piece_limit(governor_micro_batch, length, upper))
        governor_micro_batch = record.next_micro_batch
    expected = plain_loop(tokens, labels, [record.examples for record in report.updates])
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), expected))
    assert diff < 1e-5


def test_variable_length_updates_give_the_governor_no_step_time():
    """An update's time follows its lengths (docs/guide-sequences.md, "Train on variable-length
    examples": 256 docstrings an update took 0.04-5.2 s, and a default governor fed those times halved the micro-batch without
    any memory pressure), so for variable-length examples the governor gets no step time: a
    slow-step rule that would fire on any 1% slowdown moves nothing."""
    tokens, labels = sequences()
    governor = Governor(GovernorConfig(ceiling_batch=EFFECTIVE, effective_batch=EFFECTIVE, slow_step_factor=1.01,
                                       slow_step_patience=1))
    step_times = []
    observe = governor.observe
    governor.observe = lambda observation: (step_times.append(observation.step_seconds), observe(observation))[1]
    report = fit(masked_model(), dataset(tokens, labels), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 optimizer=keras.optimizers.SGD(0.1), effective_batch=EFFECTIVE, governor=governor, epochs=3,
                 length_window_examples=16)
    assert len(step_times) == len(report.updates) == 15 and set(step_times) == {None}
    assert {record.next_micro_batch for record in report.updates} == {EFFECTIVE}


def test_length_ceilings_usage_errors_are_one_line():
    tokens, labels = sequences(count=8)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    fixed = tf.data.Dataset.from_tensor_slices((np.ones((8, 5), "int32"), labels))
    cases = [
        (fixed, LENGTH_CEILINGS, {}, "fixed shapes"),
        (dataset(tokens, labels), [64, 10], {}, "must be a LengthCeilings"),
        (dataset(tokens, labels), {64: 0}, {}, "integer >= 1"),
    ]
    for data, ceilings, extra, words in cases:
        with pytest.raises(UsageError) as error:
            fit(masked_model(), data, loss=loss, optimizer=keras.optimizers.SGD(0.1), effective_batch=EFFECTIVE,
                length_ceilings=ceilings, **extra)
        assert words in str(error.value) and "\n" not in str(error.value), str(error.value)


def token_updates(tokens, budget):
    """Update sizes by the token rule: the fewest consecutive examples reaching `budget` real tokens."""
    sizes, count, total = [], 0, 0
    for row in tokens:
        count, total = count + 1, total + len(row)
        if total >= budget:
            sizes, count, total = sizes + [count], 0, 0
    return sizes + ([count] if count else [])


def test_an_effective_batch_in_tokens_takes_examples_until_their_real_tokens_reach_it():
    tokens, labels = sequences()
    budget = 120  # tokens per update; examples are 1-29 tokens long
    expected_sizes = token_updates(tokens, budget)
    model = masked_model()
    with inject_oom([2]):
        report = fit(model, dataset(tokens, labels), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     optimizer=keras.optimizers.Adam(0.01), effective_batch=budget, batch_unit="tokens",
                     length_ceilings=LENGTH_CEILINGS)
    assert [record.examples for record in report.updates] == expected_sizes
    assert len(set(expected_sizes)) > 1  # updates of short examples hold more of them
    assert all(record.tokens >= budget for record in report.updates[:-1])
    assert sum(record.tokens for record in report.updates) == sum(len(row) for row in tokens)
    assert report.examples_seen == 40 and len(report.oom_events) == 1
    diff = max(float(np.max(np.abs(a - b)))
               for a, b in zip(model.get_weights(), plain_loop(tokens, labels, expected_sizes)))
    assert diff < 1e-5


def test_batch_unit_usage_errors_are_one_line():
    tokens, labels = sequences(count=8)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    fixed = tf.data.Dataset.from_tensor_slices((np.ones((8, 5), "int32"), labels))
    elastic = Governor(GovernorConfig(ceiling_batch=4, effective_batch=32, mode="elastic"))
    cases = [
        (fixed, "tokens", {}, "fixed shapes"),
        (dataset(tokens, labels), "words", {}, "batch_unit must be one of"),
        (dataset(tokens, labels), "tokens", {"governor": elastic}, "mode 'fixed'"),
        (dataset(tokens, labels), "tokens", {"adapt": object()}, "cannot be combined with adapt"),
    ]
    for data, unit, extra, words in cases:
        with pytest.raises(UsageError) as error:
            fit(masked_model(), data, loss=loss, optimizer=keras.optimizers.SGD(0.1), effective_batch=32,
                batch_unit=unit, **extra)
        assert words in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_token_labelled_examples_are_not_taken_for_batches_when_the_model_has_no_input_shapes():
    """Per-token labels: every component has an unknown first axis, as a batch has. A model without
    input shapes (subclassed, unbuilt) cannot tell them apart; the pipeline can."""
    from edgebatch.training.data import batched_by_structure, prepare_dataset

    tokens, _ = sequences(count=6)
    pairs = tf.data.Dataset.from_generator(lambda: ((t, t % CLASSES) for t in tokens), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32)))
    no_shapes = object()  # what _model_input_ranks makes of a model without inputs
    for data, batched in [(pairs, False), (pairs.map(lambda x, y: (x, y)).prefetch(2), False),
                          (pairs.padded_batch(3), True), (pairs.padded_batch(3).prefetch(1), True),
                          (pairs.padded_batch(3).unbatch(), False)]:
        assert batched_by_structure(data) is batched
        _, _, unbatched = prepare_dataset(data, no_shapes)
        assert unbatched is batched
    assert batched_by_structure(tf.data.Dataset.zip((pairs, pairs))) is None  # the shapes decide there


def window_order(tokens, window, update_size, count_tokens, epoch=0):
    """(positions in the order a length window trains them, update sizes): the pure plan applied to
    each window of the dataset, as fit's WindowedExamples does."""
    from edgebatch.training.length_window import plan_window, window_seed

    order, sizes = [], []
    for index, start in enumerate(range(0, len(tokens), window)):
        lengths = [len(row) for row in tokens[start : start + window]]
        for group in plan_window(lengths, update_size, count_tokens, window_seed(epoch, index)):
            order += [start + position for position in group]
            sizes.append(len(group))
    return order, sizes


@pytest.mark.parametrize("unit, update_size, window, ceilings", [("examples", EFFECTIVE, 24, None),
                                                                  ("tokens", 60, 20, LENGTH_CEILINGS)])
def test_a_length_window_trains_the_planned_updates_exactly(unit, update_size, window, ceilings):
    """Updates are cut from length-sorted windows (length_window.py), a shuffled order of them; the
    weights equal the plain loop's over those same updates, with an OOM injected (in tokens, with
    pieces cut by length ceilings too)."""
    tokens, labels = sequences()
    order, sizes = window_order(tokens, window, update_size, unit == "tokens")
    model = masked_model()
    with inject_oom([3]):
        report = fit(model, dataset(tokens, labels), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     optimizer=keras.optimizers.Adam(0.01), effective_batch=update_size, batch_unit=unit,
                     length_window_examples=window, length_ceilings=ceilings,
                     governor=Governor(GovernorConfig(ceiling_batch=4, effective_batch=update_size)))
    assert [record.examples for record in report.updates] == sizes
    assert report.examples_seen == 40 and len(report.oom_events) == 1
    # Updates of similar lengths: less padding than consecutive examples would need.
    spread = [max(len(tokens[p]) for p in group) - min(len(tokens[p]) for p in group)
              for group in np.split(np.array(order), np.cumsum(sizes)[:-1])]
    consecutive = [max(map(len, tokens[s : s + 8])) - min(map(len, tokens[s : s + 8])) for s in range(0, 40, 8)]
    assert np.mean(spread) < 0.6 * np.mean(consecutive)
    expected = plain_loop([tokens[p] for p in order], labels[order], sizes)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), expected))
    assert diff < 1e-5


def test_a_run_stopped_inside_a_length_window_resumes_to_the_uninterrupted_weights(tmp_path):
    tokens, labels = sequences()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def run(model, **kwargs):
        return fit(model, dataset(tokens, labels), loss=loss, optimizer=keras.optimizers.Adam(0.01),
                   effective_batch=EFFECTIVE, length_window_examples=24, epochs=2, **kwargs)

    whole = masked_model()
    run(whole)
    first = run(masked_model(), checkpoint_dir=str(tmp_path), max_updates=7)  # 5 updates an epoch: 2 into window 0
    assert first.final_progress.epoch == 1 and first.final_progress.examples_in_epoch == 16
    resumed = masked_model()
    second = run(resumed, checkpoint_dir=str(tmp_path))
    assert [record.update for record in second.updates] == [8, 9, 10] and second.examples_seen == 24
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(resumed.get_weights(), whole.get_weights()))
    assert diff < 1e-5


@pytest.mark.parametrize("stop_after_updates", [1, 2])
def test_a_tokens_counted_run_stopped_inside_a_length_window_resumes_to_the_uninterrupted_weights(
        tmp_path, stop_after_updates):
    """batch_unit="tokens": updates hold different numbers of examples, so where the run stopped is
    found from the window's own plan (examples_in_epoch), with length ceilings cutting pieces."""
    tokens, labels = sequences()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    budget_tokens, window = 60, 20

    def run(model, **kwargs):
        return fit(model, dataset(tokens, labels), loss=loss, optimizer=keras.optimizers.Adam(0.01),
                   effective_batch=budget_tokens, batch_unit="tokens", length_window_examples=window,
                   length_ceilings=LENGTH_CEILINGS, epochs=2, **kwargs)

    _, sizes = window_order(tokens, window, budget_tokens, True, epoch=0)
    _, second_epoch_sizes = window_order(tokens, window, budget_tokens, True, epoch=1)
    whole = masked_model()
    run(whole)
    first = run(masked_model(), checkpoint_dir=str(tmp_path), max_updates=len(sizes) + stop_after_updates)
    stopped_at = sum(second_epoch_sizes[:stop_after_updates])
    assert first.final_progress.epoch == 1 and first.final_progress.examples_in_epoch == stopped_at
    assert stopped_at < window, "the stop falls inside the second epoch's first window"
    resumed = masked_model()
    second = run(resumed, checkpoint_dir=str(tmp_path))
    assert [record.examples for record in second.updates] == second_epoch_sizes[stop_after_updates:]
    assert second.examples_seen == len(tokens) - stopped_at
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(resumed.get_weights(), whole.get_weights()))
    assert diff < 1e-5


def test_length_window_usage_errors_are_one_line():
    tokens, labels = sequences(count=8)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    fixed = tf.data.Dataset.from_tensor_slices((np.ones((8, 5), "int32"), labels))
    elastic = Governor(GovernorConfig(ceiling_batch=4, effective_batch=EFFECTIVE, mode="elastic"))
    cases = [
        (fixed, 16, {}, "fixed shapes"),
        (dataset(tokens, labels), 12, {}, "not a multiple of effective_batch 8"),
        (dataset(tokens, labels), 0, {}, "integer >= 1"),
        (dataset(tokens, labels), 16, {"governor": elastic}, "mode 'fixed'"),
        (dataset(tokens, labels), 16, {"adapt": object()}, "adapt"),
    ]
    for data, window, extra, words in cases:
        with pytest.raises(UsageError) as error:
            fit(masked_model(), data, loss=loss, optimizer=keras.optimizers.SGD(0.1), effective_batch=EFFECTIVE,
                length_window_examples=window, **extra)
        assert words in str(error.value) and "\n" not in str(error.value), str(error.value)
