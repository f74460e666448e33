"""Where mmgate's vision encoder runs, and the device memory it takes from the engine.

    the engine's first CUDA device (cuda:0 of what the process sees), else the CPU
        │  (Accelerators: torch.cuda here, a fake device in tests)
        ▼
    the encoder loaded there ─▶ its need measured: weights + the peak of one forward pass at
        │                       the largest batch it will run
        ▼
    the engine's share of the device (vLLM's gpu_memory_utilization) lowered by need / total;
    a share left under MIN_ENGINE_SHARE fails the start with what was measured

vLLM checks at start that the device's free memory covers ``total x gpu_memory_utilization``;
an encoder already loaded in this process holds part of it, so the engine is given what is
left. On the CPU nothing is measured or taken (vLLM's CPU worker is sized by
``kv_cache_memory_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, final

__all__ = [
    "MIN_ENGINE_SHARE",
    "Accelerators",
    "EncoderDoesNotFit",
    "EncoderMemory",
    "TorchAccelerators",
    "engine_share",
]

GiB: Final = 1024**3
# below this share of the device the engine cannot hold a model and a useful KV cache
MIN_ENGINE_SHARE: Final = 0.05


class Accelerators(Protocol):
    """What mmgate asks of the machine's accelerators."""

    def engine_device(self) -> str | None:
        """The torch device of the engine's first accelerator ("cuda:0"); None: the CPU."""
        ...

    def memory(self, device: str) -> tuple[int, int]:
        """(free, total) bytes of ``device``."""
        ...

    def peak_bytes(self, device: str, run: Callable[[], object]) -> int:
        """The most memory ``run()`` allocated on ``device`` at once, beyond what it found."""
        ...

    def release(self, device: str) -> None:
        """Give ``device`` back what this process holds of it and no longer uses."""
        ...


@final
class TorchAccelerators:
    """The CUDA devices torch sees, where the engine runs on them (vLLM's platform says)."""

    def engine_device(self) -> str | None:
        import torch
        from vllm.platforms import current_platform

        if not current_platform.is_cuda_alike() or not torch.cuda.is_available():
            return None
        # vLLM's first worker takes the first device the process sees (CUDA_VISIBLE_DEVICES)
        return "cuda:0"

    def memory(self, device: str) -> tuple[int, int]:
        import torch

        free, total = torch.cuda.mem_get_info(torch.device(device))
        return int(free), int(total)

    def peak_bytes(self, device: str, run: Callable[[], object]) -> int:
        import torch

        where = torch.device(device)
        torch.cuda.synchronize(where)
        before = torch.cuda.memory_allocated(where)
        torch.cuda.reset_peak_memory_stats(where)
        run()
        torch.cuda.synchronize(where)
        return max(0, int(torch.cuda.max_memory_allocated(where)) - int(before))

    def release(self, device: str) -> None:
        import torch

        with torch.cuda.device(torch.device(device)):
            torch.cuda.empty_cache()


@final
@dataclass(frozen=True, slots=True)
class EncoderMemory:
    """What the vision encoder holds on its device: its weights, and at most ``activations``
    more while it encodes its largest batch."""

    device: str
    weights: int
    activations: int
    total: int  # the device's memory

    @property
    def need(self) -> int:
        return self.weights + self.activations

    def describe(self) -> str:
        return (
            f"the vision encoder needs {self.need / GiB:.2f} GiB of {self.device}'s "
            f"{self.total / GiB:.1f} GiB (weights {self.weights / GiB:.2f} GiB, "
            f"activations {self.activations / GiB:.2f} GiB at its largest batch)"
        )


class EncoderDoesNotFit(RuntimeError):
    """The encoder would leave the engine too little of its device: the server does not start."""


def engine_share(share: float, memory: EncoderMemory | None) -> float:
    """The engine's share of its device (vLLM's gpu_memory_utilization) once the encoder has
    taken its need out of ``share``, the share both may use together.

    Raises:
        EncoderDoesNotFit: under MIN_ENGINE_SHARE would be left.
    """
    if memory is None:
        return share
    left = share - memory.need / memory.total
    if left < MIN_ENGINE_SHARE:
        raise EncoderDoesNotFit(
            f"{memory.describe()}, which leaves the engine {max(left, 0.0):.0%} of the device "
            f"(MMGATE_ENGINE__GPU_MEMORY_UTILIZATION {share}, at least "
            f"{MIN_ENGINE_SHARE:.0%} needed): raise it, lower MMGATE_MEDIA__ENCODE_BATCH, or "
            "let the engine encode images (MMGATE_MEDIA__MODE=pixels)"
        )
    return left
