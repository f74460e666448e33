"""vLLM's CPU matrix multiply for the towers mmgate runs itself.

On a CPU, vLLM does not run a model's ``nn.Linear`` layers through ``torch.nn.functional.linear``:
it packs each weight once for oneDNN (or zentorch, or its own kernels where they apply) and calls
that (``dispatch_cpu_unquantized_gemm``). A tower mmgate runs with transformers' plain layers
took ~1.6 s where vLLM's took ~1.2 s for the same clip on the same CPU (a Qwen2-VL-2B-shaped
video tower, float32, one thread); with its layers packed this way, ~1.25 s. :func:`pack_linears`
swaps a module's linear layers for ones that call vLLM's kernel, their weights packed and the
originals freed.

vLLM's oneDNN path keeps process-wide state (one stream, one scratch buffer, each weight's
primitive cache), written for its worker's single thread; mmgate's towers run in worker threads
of the encode pool, so each call is made under one process-wide lock. vLLM's own worker runs in
its engine process, never in mmgate's. Imported where a tower is loaded (it imports torch).
"""

from __future__ import annotations

import threading
from typing import Final, final

import torch

__all__ = ["pack_linears"]

_ONE_AT_A_TIME: Final = threading.Lock()


def pack_linears(module: torch.nn.Module) -> int:
    """Every ``nn.Linear`` inside ``module``, which must be on the CPU, replaced by one that runs
    vLLM's CPU kernel on a packed copy of its weight; the number replaced."""
    if not _on_cpu(module):
        return 0
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, _PackedLinear(child))
                replaced += 1
    return replaced


def _on_cpu(module: torch.nn.Module) -> bool:
    return all(p.device.type == "cpu" for p in module.parameters())


@final
class _PackedLinear(torch.nn.Module):  # type: ignore[misc]  # torch is untyped here
    """A linear layer run by vLLM's CPU kernel (its weight packed, the original freed)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        super().__init__()
        dispatch_cpu_unquantized_gemm(linear, remove_weight=True)
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linear = self.linear
        with _ONE_AT_A_TIME:
            out: torch.Tensor = linear.cpu_linear(x, linear.weight, linear.bias)
        return out
