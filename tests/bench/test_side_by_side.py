"""The benchmarks' fairness (vLLM's own server gets exactly mmgate's engine arguments) and their
readings of /proc."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from subprocess import PIPE

import pytest

from bench import grpc_stream
from bench.openai_server import descendants, server_flags
from bench.service import context_switches, interval_of, with_interval
from services.config import EngineSettings
from services.engine.plan import EnginePlan, ImageIntake
from services.engine.worker import EngineWorker


@pytest.mark.parametrize("images", [None, 1])
def test_vllms_server_parses_back_mmgates_engine_arguments(images: int | None) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    settings = EngineSettings(
        dtype="bfloat16",
        max_model_len=1024,
        stream_interval=4,
        extra={"max_num_batched_tokens": 512},
    )
    intake = None if images is None else ImageIntake(per_prompt=images, embeddings=False)
    ours = EngineWorker(settings).engine_args(EnginePlan("/models/smol", intake))
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    theirs = AsyncEngineArgs.from_cli_args(parser.parse_args(server_flags(ours)))
    # what mmgate sets: every field where its arguments are not vLLM's defaults (where they are,
    # the server's CLI defaults stand, which are vLLM's too)
    defaults = AsyncEngineArgs(model=ours.model)
    chosen = [
        f.name
        for f in dataclasses.fields(ours)
        if getattr(ours, f.name) != getattr(defaults, f.name)
    ]
    differ = {
        name: (getattr(ours, name), getattr(theirs, name))
        for name in chosen
        if not same(getattr(ours, name), getattr(theirs, name))
    }
    assert differ == {}
    assert {"dtype", "max_model_len", "kv_cache_memory_bytes", "stream_interval"} <= set(chosen)
    assert (theirs.model, theirs.seed) == (ours.model, ours.seed)
    assert theirs.dtype == "bfloat16"
    assert theirs.kv_cache_memory_bytes == settings.kv_cache_memory_bytes
    assert theirs.max_num_batched_tokens == 512
    assert theirs.stream_interval == 4
    assert (theirs.limit_mm_per_prompt or {}).get("image") == images


@pytest.mark.parametrize("name", ["mmgate (prompt)", "vllm serve", "in-process"])
def test_a_contenders_name_carries_its_stream_interval(name: str) -> None:
    assert with_interval(name, 1) == name
    assert interval_of(name) == 1
    assert with_interval(name, 4) == f"{name} /4"
    assert interval_of(with_interval(name, 16)) == 16


def same(ours: object, theirs: object) -> bool:
    # the CLI reads one served model name as a list of one
    return ours == theirs or (isinstance(ours, str) and theirs == [ours])


def test_a_spawned_process_is_among_the_descendants() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=PIPE)
    try:
        assert child.pid in descendants(os.getpid())
        assert os.getpid() not in descendants(os.getpid())
    finally:
        child.communicate(b"", timeout=30)


def test_context_switches_count_every_thread_and_only_grow() -> None:
    before = context_switches([os.getpid()])
    # a thread that blocks and wakes switches voluntarily at least once
    done = threading.Event()
    waiter = threading.Thread(target=done.wait)
    waiter.start()
    done.set()
    waiter.join()
    after = context_switches([os.getpid()])
    assert after[0] > before[0] >= 0
    assert after[1] >= before[1] >= 0
    # a process that is gone counts nothing (it left between listing and reading)
    assert context_switches([2**22 + 1]) == (0, 0)


@pytest.mark.timeout(120)
def test_the_grpc_stream_benchmark_measures_both_variants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    grpc_stream.main(["--streams", "2", "--messages", "3", "--step-ms", "5", "--repeats", "1"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"default", "classic-poller"}, out
    # the baseline is its own 1.00x (a figure that is 0 on so short a run has no ratio)
    assert "(1.00x)" in rows["default"], out
    assert "voluntary" in out.splitlines()[1], out


def test_the_unary_benchmark_takes_its_ratios_within_a_round() -> None:
    from bench.unary import Row, report

    rows = [
        Row("mmgate every step", 1, 16, 100.0, 900.0, 40.0, 5.0, 0.0),
        Row("mmgate final only", 1, 16, 110.0, 850.0, 30.0, 5.0, 0.0),
        Row("vllm serve", 1, 16, 105.0, 870.0, 20.0, 5.0, 0.0),
        Row("mmgate final only", 2, 16, 1.0, 1.0, 1.0, 1.0, 0.0),  # no partner in round 2
    ]
    (found,) = report(rows)["ratios"]
    assert (found["round"], found["concurrency"]) == (1, 16)
    assert found["cpu_final_over_every_step"] == 0.75
    assert found["cpu_final_over_vllm"] == 1.5
    assert found["tps_final_over_every_step"] == 1.1


def test_the_adapter_benchmark_takes_its_ratios_within_a_round() -> None:
    from bench.adapters import report

    def row(side: str, round_: int, tps: float) -> dict[str, object]:
        return {"side": side, "round": round_, "concurrency": 16, "tokens_per_second": tps}

    rows = [
        row("adapter", 1, 40.0),
        row("base, LoRA on", 1, 80.0),
        row("base, LoRA off", 1, 100.0),
        row("adapter", 2, 30.0),
        row("base, LoRA on", 2, 60.0),  # no server without adapters in round 2
    ]
    first, second = report(rows)["ratios"]
    assert first["adapter_over_base_lora_on"] == 0.5
    assert first["adapter_over_base_lora_off"] == 0.4
    assert first["base_lora_on_over_off"] == 0.8
    assert second["adapter_over_base_lora_off"] is None


def test_the_queue_benchmark_takes_its_ratios_within_a_round() -> None:
    from bench.fair_queue import report

    def row(side: str, round_: int, tps: float) -> dict[str, object]:
        return {"side": side, "round": round_, "concurrency": 64, "tokens_per_second": tps}

    rows = [row("queue", 1, 99.0), row("no queue", 1, 100.0), row("no queue", 2, 50.0)]
    rows.append(row("queue", 2, 51.0))
    found = report(rows)["ratios"]
    assert [(r["round"], round(r["queue_over_none"], 2)) for r in found] == [(1, 0.99), (2, 1.02)]


def test_the_weights_benchmark_counts_apart_the_grants_made_while_both_tenants_waited() -> None:
    from bench.fair_weights import report

    def sample(
        heavy: float, light: float, waiting: tuple[int, int], at: float
    ) -> dict[str, object]:
        return {
            "at": at,
            "granted": {"heavy": heavy, "light": light},
            "waiting": {"heavy": waiting[0], "light": waiting[1]},
        }

    samples = [
        sample(0, 0, (20, 20), at=0),
        sample(6, 2, (18, 22), at=3),  # both waited at both ends: 6 and 2
        sample(9, 3, (0, 21), at=6),  # heavy's queue ran dry: apart
        sample(9, 9, (5, 20), at=9),  # apart (it began dry)
        sample(12, 10, (7, 19), at=12),  # both: 3 and 1
        sample(20, 20, (7, 19), at=30),  # a late scrape: apart
    ]
    found = report(samples, every=3.0)
    assert found["steady"] == {"heavy": 9, "light": 3}
    assert found["steady_ratio"] == 3.0
    assert found["otherwise"] == {"heavy": 11, "light": 17}
