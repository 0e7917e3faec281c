"""PressureReader with fake sensor sources: rate limiting by updates and by time, worst-of aggregation."""

import warnings
from types import SimpleNamespace

import pytest

from edgebatch.governor import PressureReader, parse_device

GiB = 1024**3


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Counter:
    """A source that counts its calls and returns `value` (a callable value is called)."""

    def __init__(self, value):
        self.value = value
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.value() if callable(self.value) else self.value


def host(total=16 * GiB, available=8 * GiB, rss=2 * GiB, limit=None, used_fraction=None, psi=None):
    limit = total if limit is None else limit
    return SimpleNamespace(
        total_bytes=total, available_bytes=available, process_rss_bytes=rss, limit_bytes=limit,
        available_to_process_bytes=available,
        used_fraction=(limit - available) / limit if used_fraction is None else used_fraction,
        psi=None if psi is None else SimpleNamespace(some_avg10=psi),
    )


def allocator(current, peak=None):
    return SimpleNamespace(device="GPU:0", current_bytes=current, peak_bytes=current if peak is None else peak)


def gpu(total, used):
    return SimpleNamespace(index=0, total_bytes=total, used_bytes=used, free_bytes=total - used)


def test_reads_every_n_updates_when_time_allows():
    source = Counter(host())
    reader = PressureReader(every_n_updates=3, min_interval_seconds=0.0, clock=FakeClock(), sources={"host": source})
    read = [reader.read().pressure is not None for _ in range(7)]
    assert read == [True, False, False, True, False, False, True]
    assert source.calls == 3 == reader.reads


def test_reads_no_more_often_than_the_interval():
    clock = FakeClock()
    source = Counter(host())
    reader = PressureReader(every_n_updates=1, min_interval_seconds=0.5, clock=clock, sources={"host": source})
    results = []
    for _ in range(6):
        results.append(reader.read().pressure is not None)
        clock.now += 0.2
    # reads at t=0.0, 0.6 (0.4 is too soon), 1.2
    assert results == [True, False, False, True, False, False]
    assert source.calls == 2


def test_both_limits_must_pass():
    clock = FakeClock()
    reader = PressureReader(every_n_updates=2, min_interval_seconds=1.0, clock=clock, sources={"host": Counter(host())})
    assert reader.read().pressure is not None
    clock.now += 5.0
    assert reader.read().pressure is None  # time passed, but only 1 update
    assert reader.read().pressure is not None


def test_force_reads_regardless_and_restarts_the_count():
    reader = PressureReader(
        every_n_updates=3, min_interval_seconds=10.0, clock=FakeClock(), sources={"host": Counter(host())}
    )
    reader.read()
    assert reader.read(force=True).pressure is not None
    assert reader.read().pressure is None


def test_on_gpu_the_room_comes_from_the_allocator_measure_with_the_least_room():
    reader = PressureReader(
        device="GPU:0",
        budget_bytes=10 * GiB,
        sources={
            "allocator": lambda: allocator(current=3 * GiB, peak=5 * GiB),  # 0.30 of the budget
            "gpu": lambda: gpu(total=16 * GiB, used=12 * GiB),  # 0.75; our pool ~ peak: 7 GiB not ours
            "host": lambda: host(total=32 * GiB, available=16 * GiB, rss=4 * GiB, psi=2.5),  # 0.50
        },
    )
    observation = reader.read()
    assert observation.pressure == pytest.approx(0.75)
    assert observation.limit_bytes == 16 * GiB and observation.used_bytes == 7 * GiB
    assert observation.measure == "allocator_peak" and observation.own_bytes == 5 * GiB
    assert observation.psi_some_avg10 == 2.5
    assert set(reader.last_readings) == {"allocator", "gpu", "host"}
    assert reader.last_readings["allocator"].pressure == pytest.approx(0.3)


def test_host_wins_when_it_is_worst_and_reports_used_not_ours():
    reader = PressureReader(
        budget_bytes=10 * GiB,
        sources={
            "allocator": lambda: allocator(current=1 * GiB),
            "host": lambda: host(total=32 * GiB, limit=8 * GiB, available=1 * GiB, rss=5 * GiB),
        },
    )
    observation = reader.read()
    assert observation.pressure == pytest.approx(7 / 8)
    assert observation.limit_bytes == 8 * GiB and observation.used_bytes == 2 * GiB


def test_on_cpu_the_room_is_the_hosts_even_when_the_allocator_reads_worse():
    # the model (probed on CPU) predicts RSS: the allocator's bytes are another measure
    reader = PressureReader(
        budget_bytes=2 * GiB,
        sources={
            "allocator": lambda: allocator(current=int(1.9 * GiB)),  # 0.95 of the budget
            "host": lambda: host(total=32 * GiB, available=20 * GiB, rss=10 * GiB),  # 12 used, 2 others
        },
    )
    observation = reader.read()
    assert observation.pressure == pytest.approx(0.95)
    assert observation.limit_bytes == 32 * GiB and observation.used_bytes == 2 * GiB
    assert observation.measure == "process_peak" and observation.own_bytes == 10 * GiB
    assert observation.room_bytes == 30 * GiB


def test_a_tighter_budget_binds_on_gpu():
    reader = PressureReader(device="GPU:0", budget_bytes=6 * GiB, sources={
        "allocator": lambda: allocator(current=3 * GiB, peak=5 * GiB),
        "gpu": lambda: gpu(total=16 * GiB, used=12 * GiB),  # room 16 - 7 = 9 GiB > the budget's 6
    })
    observation = reader.read()
    assert observation.limit_bytes == 6 * GiB and observation.used_bytes == 0
    assert observation.measure == "allocator_peak"


def test_an_explicit_measure_picks_its_reading():
    reader = PressureReader(device="GPU:0", measure="process_peak", sources={
        "gpu": lambda: gpu(total=16 * GiB, used=12 * GiB),
        "host": lambda: host(total=32 * GiB, available=16 * GiB, rss=4 * GiB),
    })
    observation = reader.read()
    assert observation.measure == "process_peak" and observation.used_bytes == 12 * GiB


def test_without_a_reading_in_its_measure_the_worst_reading_gives_the_room():
    reader = PressureReader(budget_bytes=4 * GiB, sources={"allocator": lambda: allocator(GiB)})
    observation = reader.read()
    assert observation.measure == "allocator_peak" and observation.limit_bytes == 4 * GiB
    assert observation.used_bytes == 0


def test_allocator_without_budget_on_cpu_is_skipped_and_on_gpu_uses_nvml_total():
    cpu = PressureReader(sources={"allocator": lambda: allocator(5 * GiB)})
    assert cpu.read().pressure is None
    on_gpu = PressureReader(device="/device:GPU:0", sources={
        "allocator": lambda: allocator(8 * GiB), "gpu": lambda: gpu(total=10 * GiB, used=6 * GiB)})
    assert on_gpu.read().pressure == pytest.approx(0.8)


def test_unavailable_sources_give_no_pressure():
    reader = PressureReader(sources={"host": lambda: None, "allocator": lambda: None})
    assert reader.read().pressure is None


def test_a_failing_source_is_warned_about_once_and_skipped():
    def broken():
        raise OSError("no /proc here")

    reader = PressureReader(every_n_updates=1, min_interval_seconds=0.0,
                            sources={"host": broken, "allocator": lambda: allocator(GiB)}, budget_bytes=4 * GiB)
    with pytest.warns(RuntimeWarning, match="'host'.*no /proc here"):
        assert reader.read().pressure == pytest.approx(0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reader.read().pressure == pytest.approx(0.25)


@pytest.mark.parametrize(
    "kwargs, quoted",
    [
        ({"device": "TPU:0"}, "'TPU:0'"),
        ({"budget_bytes": 0}, "0"),
        ({"every_n_updates": 0}, "0"),
        ({"min_interval_seconds": -1.0}, "-1.0"),
        ({"sources": {"disk": lambda: None}}, "'disk'"),
        ({"sources": {"host": 3}}, "'host'"),
        ({"measure": "rss"}, "'rss'"),
    ],
)
def test_bad_arguments_are_refused_quoting_them(kwargs, quoted):
    with pytest.raises(ValueError) as info:
        PressureReader(**kwargs)
    assert quoted in str(info.value)


@pytest.mark.parametrize("text, parsed", [("CPU:0", ("CPU", 0)), ("/device:GPU:1", ("GPU", 1)),
                                          ("/GPU:2", ("GPU", 2)), ("gpu:0", ("GPU", 0))])
def test_parse_device(text, parsed):
    assert parse_device(text) == parsed


def test_real_host_sensor_gives_a_pressure():
    # The real host sensor (psutil, /proc, cgroup files) through the reader's conversion.
    from edgebatch.sensors import read_host_memory

    observation = PressureReader(sources={"host": read_host_memory}).read()
    assert observation.pressure is not None and 0.0 < observation.pressure <= 1.5
    assert observation.limit_bytes > 0 and observation.used_bytes >= 0


def test_a_neighbour_seen_through_the_host_sensor_is_followed_down_and_back_up():
    # The whole chain: fake host readings -> PressureReader -> Governor.from_profile's CPU model.
    # The job's RSS stays at its peak (pools keep memory); the neighbour takes 1.5 GiB and leaves.
    from edgebatch.governor import Governor

    MiB = 1024 * 1024
    limit, fixed, per_sample = 4096 * MiB, 849 * MiB, 11.6 * MiB
    profile = SimpleNamespace(safe_batch=128, max_batch=140, measure="process_peak",
                              memory_model=SimpleNamespace(fixed_bytes=fixed, per_sample_bytes=per_sample))
    governor = Governor.from_profile(profile, effective_batch=128)
    clock, state = FakeClock(), {"neighbour": 0, "rss": 0}

    def host_now():
        used = state["neighbour"] + state["rss"]
        return host(total=limit, available=limit - used, rss=state["rss"])

    reader = PressureReader(every_n_updates=1, min_interval_seconds=0.0, clock=clock, sources={"host": host_now})
    sizes, pressures = [], []
    for update in range(300):
        state["neighbour"] = 1500 * MiB if 50 <= update < 150 else 0
        state["rss"] = max(state["rss"], int(fixed + per_sample * governor.decision.micro_batch))
        assert state["neighbour"] + state["rss"] <= limit, f"out of memory at update {update}"
        sizes.append(governor.decision.micro_batch)
        observation = reader.read()
        pressures.append(observation.pressure)
        governor.observe(observation)
    assert sizes[:51] == [128] * 51
    assert set(sizes[51:151]) == {79}, "down to the model's fit beside the neighbour, no further"
    assert sizes[-1] == 128 and sizes.index(128, 151) <= 157
    # the whole device read above the shrink threshold all along the neighbour's stay (our RSS
    # kept its peak): judged on that, the micro-batch would have been halved every cooldown
    assert min(pressures[50:150]) > governor.config.shrink_above_pressure


def test_on_gpu_a_neighbour_is_seen_through_nvml_less_our_allocator_pool():
    # Our allocator's pool stays at its peak (TensorFlow keeps it); another process takes 4 GiB of
    # the GPU and leaves. The model is in the allocator's measure, as a GPU profile's is.
    from edgebatch.governor import Governor

    total, fixed, per_sample = 16 * GiB, 1 * GiB, 64 * 1024 * 1024
    profile = SimpleNamespace(safe_batch=160, max_batch=170, measure="allocator_peak",
                              memory_model=SimpleNamespace(fixed_bytes=fixed, per_sample_bytes=per_sample))
    governor = Governor.from_profile(profile, effective_batch=160)
    state = {"neighbour": 0, "peak": 0, "context": 400 * 1024 * 1024}  # CUDA context: NVML counts it

    def allocator_now():
        return allocator(current=fixed, peak=state["peak"])

    def gpu_now():
        return gpu(total=total, used=state["context"] + state["peak"] + state["neighbour"])

    reader = PressureReader(device="GPU:0", every_n_updates=1, min_interval_seconds=0.0, clock=FakeClock(),
                            sources={"allocator": allocator_now, "gpu": gpu_now})
    sizes = []
    for update in range(200):
        state["neighbour"] = 4 * GiB if 40 <= update < 120 else 0
        state["peak"] = max(state["peak"], fixed + per_sample * governor.decision.micro_batch)
        assert state["context"] + state["peak"] + state["neighbour"] <= total, f"out of memory at {update}"
        sizes.append(governor.decision.micro_batch)
        governor.observe(reader.read())
    # predicted at 160 beside it: (4.4 GiB others + 11 GiB) / 16 GiB = 0.96; the fit is
    # (0.8 x 16 GiB - 4.4 GiB - 1 GiB) / 64 MiB = 118
    assert sizes[:41] == [160] * 41
    assert set(sizes[41:121]) == {118}
    assert sizes[-1] == 160


def test_a_host_full_of_our_own_pool_lets_the_micro_batch_grow():
    # RSS is 95% of the cgroup limit from the start (an earlier, larger run); nobody else is there.
    from edgebatch.governor import Governor

    MiB = 1024 * 1024
    limit = 8 * GiB
    profile = SimpleNamespace(safe_batch=256, max_batch=300, measure="process_peak",
                              memory_model=SimpleNamespace(fixed_bytes=849 * MiB, per_sample_bytes=11.6 * MiB))
    governor = Governor.from_profile(profile, effective_batch=256)
    governor.reset(start_micro_batch=16)
    own = int(0.95 * limit)
    reader = PressureReader(every_n_updates=1, min_interval_seconds=0.0, clock=FakeClock(),
                            sources={"host": lambda: host(total=limit, available=limit - own, rss=own)})
    sizes = []
    for _ in range(200):
        sizes.append(governor.decision.micro_batch)
        observation = reader.read()
        assert observation.pressure == pytest.approx(0.95)
        governor.observe(observation)
    assert sorted(sizes) == sizes and sizes[-1] == 256
