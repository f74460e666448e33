"""Where the vision encoder runs and what the engine keeps of its device, decided by a stand-in
accelerator (this machine has none): the plan builds the tower on the device the accelerator
names, measures it there and lowers the engine's share, or refuses to start; and auto's measured
choice between embeddings and pixels."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from services.config import EngineSettings, MediaSettings
from services.engine.placement import (
    MIN_ENGINE_SHARE,
    EncoderDoesNotFit,
    EncoderMemory,
    engine_share,
)
from services.engine.plan import EnginePlan
from services.engine.worker import EngineWorker
from services.pipeline.media.plan import plan_media

GiB = 1024**3
MiB = 1024**2


@dataclass
class FakeCuda:
    """An accelerator whose torch device is "cpu:0" (a device torch runs here, named apart from
    the CPU the encoder uses by default) with ``total`` bytes, reporting ``peak`` for a run."""

    total: int = 8 * GiB
    peak: int = 64 * MiB
    device: str = "cpu:0"
    runs: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    def engine_device(self) -> str | None:
        return self.device

    def release(self, device: str) -> None:
        self.released.append(device)

    def memory(self, device: str) -> tuple[int, int]:
        assert device == self.device
        return self.total // 2, self.total

    def peak_bytes(self, device: str, run: Callable[[], object]) -> int:
        assert device == self.device
        self.runs.append(device)
        run()
        return self.peak


class NoAccelerator:
    def engine_device(self) -> str | None:
        return None

    def memory(self, device: str) -> tuple[int, int]:
        raise AssertionError("no device to ask")

    def peak_bytes(self, device: str, run: Callable[[], object]) -> int:
        raise AssertionError("no device to ask")

    def release(self, device: str) -> None:
        raise AssertionError("no device to ask")


EMBEDDINGS = MediaSettings(mode="embeddings")


def test_the_engines_device_decides_where_the_tower_runs_and_what_the_engine_keeps(
    tiny_llava: Path,
) -> None:
    cuda = FakeCuda()
    plan = plan_media(EMBEDDINGS, str(tiny_llava), "float32", device_share=0.9, accelerators=cuda)
    encoder = plan.encoder
    assert encoder is not None
    assert encoder.device == torch.device("cpu:0")
    # its need measured there: weights and the activations of its largest batch
    assert cuda.runs == ["cpu:0"]
    memory = plan.encoder_memory
    assert memory == EncoderMemory("cpu:0", encoder.weight_bytes, cuda.peak, cuda.total)
    assert memory.weights > 0
    assert plan.device_share == pytest.approx(0.9 - memory.need / cuda.total)
    # what the cache keeps is on the CPU, wherever the tower ran
    (image,) = encoder.blank_images(1)
    assert encoder.encode([image]).device == torch.device("cpu")
    # and vLLM is given the rest of the device
    worker = EngineWorker(EngineSettings())
    engine_plan = EnginePlan(str(tiny_llava), plan.intake(), device_share=plan.device_share)
    worker._on_cpu = lambda: False  # type: ignore[method-assign]
    assert worker.engine_args(engine_plan).gpu_memory_utilization == pytest.approx(
        plan.device_share
    )


def test_without_an_accelerator_the_tower_runs_on_the_cpu_and_takes_nothing(
    tiny_llava: Path,
) -> None:
    plan = plan_media(
        EMBEDDINGS, str(tiny_llava), "float32", device_share=0.9, accelerators=NoAccelerator()
    )
    assert plan.encoder is not None
    assert plan.encoder.device == torch.device("cpu")
    assert plan.encoder_memory is None
    assert plan.device_share == 0.9


def test_a_tower_that_leaves_the_engine_too_little_fails_the_start_saying_why(
    tiny_llava: Path,
) -> None:
    cuda = FakeCuda(total=GiB, peak=900 * MiB)
    with pytest.raises(EncoderDoesNotFit) as refused:
        plan_media(EMBEDDINGS, str(tiny_llava), "float32", device_share=0.9, accelerators=cuda)
    message = str(refused.value)
    assert "the vision encoder needs 0.88 GiB of cpu:0's 1.0 GiB" in message
    assert "leaves the engine 2% of the device" in message
    assert "MMGATE_ENGINE__GPU_MEMORY_UTILIZATION" in message


def test_the_engines_share_is_what_the_encoder_leaves() -> None:
    memory = EncoderMemory("cuda:0", weights=6 * GiB, activations=2 * GiB, total=80 * GiB)
    assert engine_share(0.9, memory) == pytest.approx(0.8)
    assert engine_share(0.9, None) == 0.9
    with pytest.raises(EncoderDoesNotFit):
        engine_share(0.1 + MIN_ENGINE_SHARE / 2, memory)


@pytest.mark.parametrize(("bound_ms", "chosen"), [(1e6, "pixels"), (0.0, "embeddings")])
def test_auto_leaves_a_fast_tower_to_the_engine_and_says_why(
    tiny_llava: Path, bound_ms: float, chosen: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = MediaSettings(mode="auto", auto_min_encode_ms=bound_ms)
    with caplog.at_level(logging.INFO, logger="mmgate.media"):
        plan = plan_media(
            settings, str(tiny_llava), "float32", device_share=0.9, accelerators=NoAccelerator()
        )
    assert (plan.encoder is not None) == (chosen == "embeddings")
    (said,) = [r.getMessage() for r in caplog.records if "media mode auto chose" in r.getMessage()]
    assert said.startswith(f"media mode auto chose {chosen}: the vision encoder takes ")
    assert "ms an image on cpu" in said


def test_a_tower_auto_leaves_to_the_engine_gives_its_device_memory_back(tiny_llava: Path) -> None:
    """Loaded on the GPU to be timed, then dropped: what torch's allocator kept of it goes back
    to the device before vLLM checks the device's free memory, and the engine keeps its share."""
    cuda = FakeCuda()
    settings = MediaSettings(mode="auto", auto_min_encode_ms=1e6)
    plan = plan_media(settings, str(tiny_llava), "float32", device_share=0.9, accelerators=cuda)
    assert plan.encoder is None
    assert cuda.released == ["cpu:0"]
    assert (cuda.runs, plan.encoder_memory, plan.device_share) == ([], None, 0.9)
