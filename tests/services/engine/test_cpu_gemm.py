"""mmgate's own towers on a CPU run their linear layers through vLLM's kernel, as its engine
does."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from services.engine.cpu_gemm import pack_linears
from services.engine.video_encoder import ClipEncoder


def linears(module: torch.nn.Module) -> int:
    """Linear layers that still hold their own weight: run by torch, not by vLLM's kernel
    (which packs a copy and frees the original)."""
    return sum(type(m) is torch.nn.Linear and m.weight.numel() > 0 for m in module.modules())


def test_packed_layers_compute_what_the_plain_ones_do() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(96, 64), torch.nn.GELU(), torch.nn.Linear(64, 16, bias=False)
    ).eval()
    x = torch.randn(12, 96)
    with torch.inference_mode():
        expected = model(x)
        assert pack_linears(model) == 2
        assert linears(model) == 0
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


def test_packed_layers_called_from_several_threads_at_once_agree() -> None:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 32)).eval()
    pack_linears(model)
    inputs = [torch.randn(rows, 256) for rows in (3, 17, 64, 5, 33, 8)]
    with torch.inference_mode():
        serial = [model(x) for x in inputs]
    results: dict[int, list[torch.Tensor]] = {}
    start = threading.Barrier(len(inputs))

    def run(k: int) -> None:
        start.wait()
        with torch.inference_mode():
            results[k] = [model(inputs[k]) for _ in range(20)]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for k, expected in enumerate(serial):
        for got in results[k]:
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_module_off_the_cpu_is_left_as_it_is() -> None:
    model = torch.nn.Linear(4, 4, device="meta")
    wrapped = torch.nn.Sequential(model)
    assert pack_linears(wrapped) == 0
    assert linears(wrapped) == 1


def test_the_clip_tower_runs_vllms_kernel(tiny_video: Path) -> None:
    encoder = ClipEncoder.load(tiny_video, dtype="float32")
    assert linears(encoder._tower) == 0
    frames = np.full((4, 56, 56, 3), 90, dtype=np.uint8)
    clip = encoder.encode(frames)
    assert clip.embeds.shape[0] == clip.grid[0] * clip.grid[1] * clip.grid[2] // 4
    assert torch.isfinite(clip.embeds).all()
