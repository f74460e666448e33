"""The GPU check's small form on the CPU: it builds, compares and times the tiny tower."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench import gpu_encoder
from services.engine.encoder import VisionEncoder


def test_the_gpu_check_runs_on_the_cpu_and_reports_equality_and_speed(
    tiny_llava: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny").symlink_to(tiny_llava)
    out = tmp_path / "gpu-encoder.json"
    report = gpu_encoder.main(
        [
            "--device",
            "cpu",
            "--small",
            "--models",
            str(models),
            "--seconds",
            "0.1",
            "--json",
            str(out),
        ]
    )
    assert out.is_file()
    (tower,) = report["towers"]
    assert tower["tower"] == "tiny"
    assert tower["equal"]
    assert tower["on_cpu"]
    assert tower["difference"] <= tower["tolerance"]
    assert [row["batch"] for row in tower["batches"]] == list(gpu_encoder.BATCHES)
    assert all(row["encode_images_per_second"] > 0 for row in tower["batches"])
    assert all(row["forward_images_per_second"] > 0 for row in tower["batches"])


def test_embeddings_come_back_on_the_cpu_from_the_device_the_tower_runs_on(
    tiny_llava: Path,
) -> None:
    encoder = VisionEncoder.load(tiny_llava, dtype="float32")
    assert encoder is not None
    assert encoder.device == torch.device("cpu")
    images = gpu_encoder.images(3)
    assert encoder.pixels(images).device.type == "cpu"
    batched = encoder.encode(images)
    assert batched.device.type == "cpu"
    alone = torch.cat([encoder.encode([image]) for image in images])
    assert gpu_encoder.difference(batched, alone) <= gpu_encoder.TOLERANCE[torch.float32]


def test_a_difference_beyond_rounding_fails_the_check(
    tiny_llava: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_encoder, "TOLERANCE", {torch.float32: -1.0})
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny").symlink_to(tiny_llava)
    with pytest.raises(SystemExit, match="differ from the CPU"):
        gpu_encoder.main(["--device", "cpu", "--small", "--models", str(models)])
