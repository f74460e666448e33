"""The vision encoder on an accelerator: mmgate's own encoder code, torch only, no vLLM.

    python -m bench.gpu_encoder [--device cuda] [--small] [--dtype float32] [--json FILE]

For each test tower (the tiny LLaVA's; with no ``--small``, also the CLIP ViT-L/14-336-shaped
tower of LLaVA-1.5, built locally with random weights: no download):

- equality: the device's embeddings against the CPU's for the same images, and a batch's against
  the same images encoded one at a time, each within the dtype's rounding (``tolerance``: of the
  largest embedding's magnitude);
- speed: images per second through ``VisionEncoder.encode`` (image processor, tower, projector,
  the copy back to the CPU) at batch 1, 8 and 32, against the tower's and projector's bare
  forward pass on pixels already on the device (``VisionEncoder.forward``): the limit.

It needs torch, transformers, safetensors, Pillow and numpy, so it runs where vLLM cannot be
installed (``make gpu-check`` on a CUDA machine, ``--device cpu --small`` in ``make test``).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from services.engine.encoder import VisionEncoder
from services.models import build_tiny_llava, build_vitl_llava

BATCHES = (1, 8, 32)
# How far a device's or a batch's embeddings may differ from the CPU's one at a time, relative to
# the largest embedding: kernels differ in summation order (and a GPU's convolutions in TF32)
TOLERANCE = {torch.float32: 5e-3, torch.bfloat16: 5e-2, torch.float16: 1e-2}
# Each timing runs its batch at least this often (and for at least --seconds)
MIN_REPEATS = 3

TOWERS: dict[str, Callable[[Path], Path]] = {
    "tiny": build_tiny_llava,
    "vit-l-336": build_vitl_llava,
}


def images(count: int, seed: int = 0) -> list[Image.Image]:
    """Seeded noise pictures of assorted sizes (the processor resizes and crops each)."""
    rng = np.random.default_rng(seed)
    sizes = ((64, 48), (320, 240), (336, 336), (500, 375))
    return [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        for w, h in (sizes[i % len(sizes)] for i in range(count))
    ]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_second(run: Callable[[], Any], count: int, device: torch.device, seconds: float) -> float:
    """``count`` images a call: images per second over repeated calls, after one to warm up."""
    run()
    synchronize(device)
    repeats, started = 0, time.perf_counter()
    while repeats < MIN_REPEATS or time.perf_counter() - started < seconds:
        run()
        repeats += 1
    synchronize(device)
    return count * repeats / (time.perf_counter() - started)


def difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference, relative to the largest magnitude of ``b``."""
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def check_tower(
    name: str, model: Path, device: torch.device, dtype: str, seconds: float
) -> dict[str, Any]:
    encoder = VisionEncoder.load(model, dtype=dtype, device=str(device))
    assert encoder is not None, f"{model} is not a LLaVA model"
    reference = VisionEncoder.load(model, dtype=dtype) if device.type != "cpu" else encoder
    assert reference is not None
    tolerance = TOLERANCE.get(encoder.dtype, 5e-2)
    sample = images(8, seed=1)
    alone = torch.cat([reference.encode([image]) for image in sample])
    batched = encoder.encode(sample)
    found = {
        "tower": name,
        "image_tokens": encoder.image_tokens,
        "hidden_size": encoder.hidden_size,
        "dtype": str(encoder.dtype).removeprefix("torch."),
        "tolerance": tolerance,
        # the device's batch of 8 against the CPU's one at a time (on the CPU: batch against single)
        "difference": difference(batched, alone),
        "on_cpu": batched.device.type == "cpu",
        "batches": [],
    }
    found["equal"] = found["difference"] <= tolerance
    if not found["equal"]:
        return found  # a wrong answer's speed is no figure
    for size in BATCHES:
        batch = images(size, seed=size)
        pixels = encoder.pixels(batch)
        encode = per_second(functools.partial(encoder.encode, batch), size, device, seconds)
        bare = per_second(functools.partial(encoder.forward, pixels), size, device, seconds)
        found["batches"].append(
            {
                "batch": size,
                "encode_images_per_second": encode,
                "forward_images_per_second": bare,
                "encode_of_forward": encode / bare,
            }
        )
    return found


def run(device: str, towers: list[str], dtype: str, models: Path, seconds: float) -> dict[str, Any]:
    where = torch.device(device)
    report: dict[str, Any] = {
        "device": str(where),
        "device_name": torch.cuda.get_device_name(where)
        if where.type == "cuda"
        else platform.processor(),
        "torch": torch.__version__,
        "towers": [],
    }
    for name in towers:
        model = TOWERS[name](models / name)
        report["towers"].append(check_tower(name, model, where, dtype, seconds))
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="the tiny tower only")
    parser.add_argument("--dtype", default="float32", help="the towers' torch dtype")
    parser.add_argument("--models", type=Path, help="where the test models are built (kept)")
    parser.add_argument("--seconds", type=float, default=1.0, help="at least, per timing")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    towers = ["tiny"] if args.small else list(TOWERS)
    with tempfile.TemporaryDirectory() as scratch:
        report = run(args.device, towers, args.dtype, args.models or Path(scratch), args.seconds)
    for tower in report["towers"]:
        verdict = "equal" if tower["equal"] else "DIFFERENT"
        print(
            f"{report['device']} {tower['tower']} ({tower['dtype']}): {verdict} to "
            f"{tower['difference']:.1e} (tolerance {tower['tolerance']:.0e})"
        )
        for row in tower["batches"]:
            print(
                f"  batch {row['batch']:>2}: encode {row['encode_images_per_second']:8.1f} img/s, "
                f"bare forward {row['forward_images_per_second']:8.1f} img/s "
                f"({row['encode_of_forward']:.2f} of it)"
            )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if not all(tower["equal"] for tower in report["towers"]):
        raise SystemExit("the device's embeddings differ from the CPU's beyond rounding")
    return report


if __name__ == "__main__":
    main()
