"""A real probe per sequence length on CPU: transformer_tiny at two lengths, end to end.

Small on purpose (two short lengths, a 1 GiB budget, 1 s trials) so it fits the default run. It
checks what the probe records and how it is found again, not the answers against a fresh-process
truth: with 1 s trials the peaks are still rising (a lower bound), and on this model the same batch
reads up to ~5% apart between processes (a fresh process read 1,034.8 MiB at 106 x 128 tokens
where the probe's worker read 990.1 MiB; 1 run in 2 went over the budget that way). That
comparison, with the probe's default trials, is tools/bench/seq_len_bench.py (BENCHMARKS.md).
"""


import pytest

from edgebatch.probing import probe, token_fit
from edgebatch.probing.margins import fit_budget_bytes
from edgebatch.profiles import load_profile

MIB = 1024**2
BUDGET = 1024 * MIB
LENGTHS = (32, 128)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    lines = []
    directory = tmp_path_factory.mktemp("profiles")
    # One reading of each length's answer: the readings are not what this checks, and each more is
    # a new process with a TensorFlow import. Near each edge the search reads in new processes and
    # elsewhere in fork-server children, and the token model takes the children's lift off first
    # (per_length.child_lift_bytes: from batches read both ways, else fitted; children read 5-7
    # MiB above new processes in the runs of 2026-12-06 and 25-32 MiB in two runs the day before).
    # A 5% tolerance: near each edge this model's readings move by 1-2 samples between processes,
    # and at 2% the search at 128 tokens stepped one sample at a time from 91 to 96, a new
    # process each (AMD EPYC, 2026-12-06): the fixture took 121-146 s, and 47-85 s in five runs at 5%.
    found = probe("transformer_tiny", device="CPU:0", memory_budget=BUDGET, seq_lens=LENGTHS, trial_seconds=1.0,
                  profiles_dir=directory, progress=lines.append, answer_readings=1, tolerance=0.05)
    print("\n".join(lines))
    return found, directory


def test_each_length_has_its_ceiling_and_the_short_one_is_higher(profile):
    found, directory = profile
    assert sorted(found.per_length) == list(LENGTHS)
    short, long = found.per_length[32], found.per_length[128]
    assert short.max_batch > long.max_batch
    for ceiling in (short, long):
        assert ceiling.safe_batch < ceiling.max_batch and ceiling.peak_bytes <= fit_budget_bytes(BUDGET)
    # On top: the longest length's answer, which every shorter length fits too.
    assert (found.max_batch, found.safe_batch) == (long.max_batch, long.safe_batch)
    assert {t.seq_len for t in found.trials} == set(LENGTHS)
    assert found.model["inputs"] == [{"shape": [None], "dtype": "int32"}]
    assert "-len32-128-" in found.model_key and found.search["seq_lens"] == list(LENGTHS)
    assert token_fit.trusted(found.token_model) and found.token_model.per_token_squared_bytes > 0
    assert load_profile(directory / found.path_name) == found


def test_cached_profile_finds_it_by_name_and_by_model_with_its_lengths(profile):
    from edgebatch.probing import cached_profile
    from edgebatch.models.zoo import build_model, parse_model_spec

    found, directory = profile
    assert cached_profile("transformer_tiny", device="CPU:0", seq_lens=LENGTHS, profiles_dir=directory) == found
    model = build_model(parse_model_spec("transformer_tiny"))
    assert cached_profile(model, device="CPU:0", seq_lens="32,128", profiles_dir=directory) == found
    # Other lengths (here the default ladder, 64..512) are another profile.
    assert cached_profile(model, device="CPU:0", profiles_dir=directory) is None
