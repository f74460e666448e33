"""mmgate bench's parts without a server: its options' defaults are the workload's, the workload
is reproducible and does what its knobs say, percentiles are nearest-rank, and the summary counts
what happened."""

from __future__ import annotations

import dataclasses

import pytest

from services.cli.bench.load import Limits, Outcome
from services.cli.bench.report import percentile, summarize
from services.cli.bench.workload import Mix, Workload
from services.cli.commands import _parser


def planned(mix: Mix, count: int) -> list[tuple[str, bytes]]:
    workload = Workload(mix)
    return [
        (p.kind, p.request.SerializeToString()) for p in (workload.next() for _ in range(count))
    ]


def test_the_options_defaults_are_the_workloads_and_the_runs() -> None:
    args = vars(_parser().parse_args(["bench"]))
    for defaults in (Mix(), Limits()):
        for field in dataclasses.fields(defaults):
            assert args[field.name] == getattr(defaults, field.name), field.name


def test_the_same_seed_sends_the_same_requests() -> None:
    mix = Mix(image_ratio=0.5, burst_every=10, burst_size=3, seed=7)
    assert planned(mix, 40) == planned(mix, 40)
    assert planned(mix, 40) != planned(Mix(image_ratio=0.5, burst_every=10, seed=8), 40)


def test_image_ratio_repeat_and_working_set() -> None:
    workload = Workload(Mix(image_ratio=1.0, image_repeat=1.0, working_set=4, seed=1))
    images = [workload.next().request.images[0].data for _ in range(50)]
    # every request has an image; with repeat 1 only the first is new, then it is reused
    assert len(set(images)) == 1
    workload = Workload(Mix(image_ratio=1.0, image_repeat=0.0, working_set=4, seed=1))
    assert len({workload.next().request.images[0].data for _ in range(20)}) == 20
    workload = Workload(Mix(image_ratio=0.0))
    assert all(not workload.next().request.images for _ in range(20))


def test_a_burst_is_identical_deterministic_requests() -> None:
    workload = Workload(Mix(burst_every=5, burst_size=4))
    plans = [workload.next() for _ in range(12)]
    burst = [p for p in plans if p.kind == "burst"]
    # a burst every 5 requests, 4 identical ones each (the second cut short at 12)
    assert [p.index for p in burst] == [5, 6, 7, 8, 10, 11]
    first, second = burst[:4], burst[4:]
    assert len({p.request.SerializeToString() for p in first}) == 1
    assert len({p.request.SerializeToString() for p in second}) == 1
    assert first[0].request.SerializeToString() != second[0].request.SerializeToString()
    assert first[0].request.sampling.temperature == 0.0


def test_a_misbehaving_client_cancels_and_rushes_its_share_without_changing_the_requests() -> None:
    mix = Mix(image_ratio=0.5, burst_every=10, seed=3)
    rude = Mix(
        image_ratio=0.5,
        burst_every=10,
        seed=3,
        cancel_ratio=0.3,
        cancel_within=0.5,
        short_deadline_ratio=0.2,
        short_deadline=0.01,
    )
    assert planned(rude, 300) == planned(mix, 300)  # the same requests, sent rudely
    workload = Workload(rude)
    plans = [workload.next() for _ in range(1000)]
    cancelled = [p.cancel_after for p in plans if p.cancel_after is not None]
    rushed = [p.timeout for p in plans if p.timeout is not None]
    assert 240 <= len(cancelled) <= 360
    assert 140 <= len(rushed) <= 260
    assert all(0 <= seconds <= 0.5 for seconds in cancelled)
    assert all(0.001 <= seconds <= 0.01 for seconds in rushed)
    assert not any(p.cancel_after is not None and p.timeout is not None for p in plans)
    calm = Workload(mix)
    assert all(
        p.cancel_after is None and p.timeout is None for p in (calm.next() for _ in range(50))
    )


@pytest.mark.parametrize(("p", "expected"), [(50, 5.0), (90, 9.0), (99, 10.0), (100, 10.0)])
def test_percentiles_are_nearest_rank(p: float, expected: float) -> None:
    assert percentile([float(v) for v in range(10, 0, -1)], p) == expected
    assert percentile([], p) is None


def test_the_summary_counts_codes_lookups_and_the_client_bound() -> None:
    outcomes = [
        Outcome(0, "text", 0.0, ttft=0.01, latency=0.1, tokens=4,
                lookups=[("prompt", "miss", "none")]),
        Outcome(1, "text", 0.1, ttft=0.02, latency=0.2, tokens=4,
                lookups=[("prompt", "hit", "memory")]),
        Outcome(2, "image", 0.2, code="FAILED_PRECONDITION", latency=0.01),
        Outcome(3, "text", 0.3, code="UNAVAILABLE", reason="INJECTED_FAULT", latency=0.01),
    ]  # fmt: skip
    summary = summarize(outcomes, dropped=1, wall=2.0, client_cpu=1.9)
    assert (summary.requests, summary.succeeded, summary.dropped) == (4, 2, 1)
    assert summary.codes == {
        "FAILED_PRECONDITION": 1,
        "OK": 2,
        "UNAVAILABLE (INJECTED_FAULT)": 1,
    }
    assert summary.lookups == {"prompt/hit/memory": 1, "prompt/miss/none": 1}
    assert summary.output_tokens_per_second == 4.0
    assert summary.latency_ms["p50"] == 100.0
    assert summary.client_bound  # 95% of a core: the client limited the run
    assert not summarize(outcomes, 0, wall=2.0, client_cpu=0.2).client_bound
