"""The encoder-output stage: images to the embeddings that a LLaVA model's language model reads.

    PIL images ──▶ image processor ──▶ pixel_values (n, 3, H, W)
                   (the model's own, loaded as vLLM loads it)
                                        │
                                        ▼
                   vision tower, built only up to the deepest vision_feature_layer
                                        │ hidden state(s) of that layer (or layers, concatenated)
                                        ▼
                   vision_feature_select_strategy: "default" drops CLS, "full" keeps it
                                        │
                                        ▼
                   multi_modal_projector: linear_1 ─▶ act ─▶ linear_2
                                        │ (n, image_tokens, text hidden size)
                                        ▼
                   mmgate's cache (keyed by image digest) ─▶ vLLM, started with
                   enable_mm_embeds=True, given {"image": embeddings} instead of pixels

vLLM runs the same tower and projector on pixels itself; doing it here instead lets mmgate keep
the result (8 KiB an image for the tiny model, 4.5 MiB for LLaVA-1.5-7B's 576 x 4096 in bf16)
in its own cache tiers and hand vLLM the embeddings, which it splices into the prompt at the
``<image>`` positions unchanged. The output equals vLLM's own to rounding: same weights, same
layer, same processor (greedy answers from either are the same in float32).

Only the tower's and the projector's weights are read from the checkpoint (safetensors, one file
or sharded), never the language model's; the tower's layers past the selected one are skipped.
:meth:`VisionEncoder.encode` is synchronous and meant for a worker thread: it holds no mutable
state, so any number of threads may call it at once.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, final

from .vision_compat import ensure_torchvision_importable

if TYPE_CHECKING:
    import torch
    from PIL import Image

__all__ = ["VisionEncoder", "checkpoint_tensors"]

# Both checkpoint layouts that vLLM's loader accepts: "model.*" (written by late transformers 4
# releases) and the original LLaVA one (written again by transformers 5).
_TOWER_PREFIXES: Final = ("model.vision_tower.", "vision_tower.")
_PROJECTOR_PREFIXES: Final = ("model.multi_modal_projector.", "multi_modal_projector.")

# Vision towers whose outputs vLLM's LLaVA model treats as patch (+ CLS) sequences; a Pixtral
# tower (model_type llava as well) has variable-size images and break tokens, and is not one.
_SUPPORTED_TOWERS: Final = frozenset({"clip_vision_model", "siglip_vision_model"})
_STRATEGIES: Final = frozenset({"default", "full"})


@final
class VisionEncoder:
    """A LLaVA model's vision tower and projector, ready to turn images into embeddings."""

    __slots__ = (
        "_device",
        "_dtype",
        "_feature_layers",
        "_hidden_size",
        "_image_size",
        "_image_tokens",
        "_processor",
        "_projector",
        "_strategy",
        "_tower",
    )

    def __init__(
        self,
        processor: Any,
        tower: Any,
        projector: Any,
        feature_layers: tuple[int, ...],
        strategy: str,
        dtype: Any,
        device: Any,
    ) -> None:
        """Use :meth:`load`."""
        self._processor = processor
        self._tower = tower
        self._projector = projector
        self._feature_layers = feature_layers
        self._strategy = strategy
        self._dtype = dtype
        self._device = device
        self._image_tokens = 0
        self._hidden_size = 0
        self._image_size = 0

    @classmethod
    def load(cls, model_dir: Path, *, dtype: str, device: str = "cpu") -> VisionEncoder | None:
        """The encoder of the model at ``model_dir``, or None if it is not a LLaVA model.

        ``dtype`` is a torch dtype name (``"float32"``, ``"bfloat16"``, ...) or ``"auto"`` for the
        checkpoint's own; use the one vLLM serves the model in, so that both compute alike.
        ``device`` is where the tower runs (a torch device: ``"cpu"``, ``"cuda:0"``); what
        :meth:`encode` returns is on the CPU wherever it ran.

        Raises:
            ValueError: a LLaVA model with settings this encoder does not reproduce.
            FileNotFoundError: no safetensors weights in ``model_dir``.
        """
        raw = json.loads((model_dir / "config.json").read_text())
        if not _is_llava(raw):
            return None
        # transformers' image utilities import torchvision wherever it is installed; the venv's
        # .pth hook makes that work in every process, this in environments without the hook.
        ensure_torchvision_importable()
        import torch
        from transformers import AutoConfig, AutoImageProcessor, AutoModel
        from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

        config = AutoConfig.from_pretrained(model_dir)
        vision_config = config.vision_config
        if vision_config.model_type not in _SUPPORTED_TOWERS:
            raise ValueError(f"{model_dir}: a {vision_config.model_type} vision tower")
        strategy = config.vision_feature_select_strategy
        if strategy not in _STRATEGIES:
            raise ValueError(f"{model_dir}: vision_feature_select_strategy {strategy!r}")
        torch_dtype = _torch_dtype(torch, dtype, config)

        # Hidden-state indices as absolute numbers (0 is the embeddings, i the output of layer i),
        # so that they keep their meaning in a tower cut after the deepest one.
        layers = config.vision_feature_layer
        selected = (layers,) if isinstance(layers, int) else tuple(layers)
        total = vision_config.num_hidden_layers
        feature_layers = tuple(index if index >= 0 else total + 1 + index for index in selected)
        if not all(0 <= index <= total for index in feature_layers):
            raise ValueError(f"{model_dir}: vision_feature_layer {layers!r} of {total} layers")
        vision_config = copy.deepcopy(vision_config)
        vision_config.num_hidden_layers = max(feature_layers)

        tower = AutoModel.from_config(vision_config)
        projector = LlavaMultiModalProjector(config)
        tower_weights, projector_weights = _read_weights(model_dir, max(feature_layers))
        _load(tower, tower_weights, f"{model_dir}: vision tower")
        _load(projector, projector_weights, f"{model_dir}: multi_modal_projector")
        where = torch.device(device)
        tower = tower.to(device=where, dtype=torch_dtype).eval()
        projector = projector.to(device=where, dtype=torch_dtype).eval()

        processor = AutoImageProcessor.from_pretrained(model_dir)
        encoder = cls(processor, tower, projector, feature_layers, strategy, torch_dtype, where)
        # One blank image: checks the whole path once and measures the output exactly.
        encoder._image_size = int(vision_config.image_size)
        probe = encoder.encode(encoder.blank_images(1))
        encoder._image_tokens, encoder._hidden_size = int(probe.shape[1]), int(probe.shape[2])
        return encoder

    @property
    def image_tokens(self) -> int:
        """Embeddings per image: the positions one ``<image>`` token expands to in vLLM."""
        return self._image_tokens

    @property
    def hidden_size(self) -> int:
        """Size of each embedding: the language model's hidden size."""
        return self._hidden_size

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        """Where the tower runs."""
        return self._device

    @property
    def weight_bytes(self) -> int:
        """What the tower's and the projector's weights hold on the device."""
        modules = (self._tower, self._projector)
        return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())

    def blank_images(self, count: int) -> list[Image.Image]:
        """``count`` black images of the tower's own size: probes for timing and memory."""
        from PIL import Image

        size = self._image_size
        return [Image.new("RGB", (size, size)) for _ in range(count)]

    def encode(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """Embeddings of ``images``, shape ``(len(images), image_tokens, hidden_size)``, on CPU.

        Synchronous (about 3 ms an image for the tiny model on two CPU cores): call it from a
        worker thread. Thread-safe. The result is an inference tensor (read-only to autograd),
        which vLLM takes as it is; on the CPU wherever the tower ran, so a cache never holds
        device memory.
        """
        import torch

        if not images:
            return torch.empty((0, self._image_tokens, self._hidden_size), dtype=self._dtype)
        return self.forward(self.pixels(images)).to("cpu")

    def pixels(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """The image processor's pixel values for ``images``, on the tower's device and dtype."""
        batch = self._processor(images=list(images), return_tensors="pt")
        values: torch.Tensor = batch["pixel_values"].to(device=self._device, dtype=self._dtype)
        return values

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The tower and projector on pixel values already in place: embeddings on the device
        (the bare cost of an encode, without the processor and the copy back)."""
        import torch

        with torch.inference_mode():
            outputs = self._tower(pixel_values, output_hidden_states=True, return_dict=True)
            features = [outputs.hidden_states[index] for index in self._feature_layers]
            if self._strategy == "default":
                features = [feature[:, 1:] for feature in features]
            embeddings: torch.Tensor = self._projector(torch.cat(features, dim=-1))
        return embeddings


def _is_llava(config: dict[str, Any]) -> bool:
    """LLaVA-1.5 layout: ``LlavaForConditionalGeneration`` / model_type ``llava``."""
    architectures = config.get("architectures") or []
    return "LlavaForConditionalGeneration" in architectures or config.get("model_type") == "llava"


def _torch_dtype(torch: Any, name: str, config: Any) -> Any:
    if name == "auto":
        name = str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype {name!r} is not a torch floating-point type")
    return dtype


def _weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files: the one file, or the shards its index names."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = json.loads(index.read_text())["weight_map"].values()
        return [model_dir / shard for shard in sorted(set(shards))]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")


def _read_weights(model_dir: Path, tower_layers: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tower's weights (up to layer ``tower_layers``) and the projector's, prefixes removed.

    Tensors are read one by one from the files, so the language model's are never loaded.
    """
    from safetensors import safe_open

    tower: dict[str, Any] = {}
    projector: dict[str, Any] = {}
    for path in _weight_files(model_dir):
        with safe_open(str(path), framework="pt") as checkpoint:
            for name in checkpoint.keys():  # noqa: SIM118 (a safe_open handle is no dict)
                if (local := _strip(name, _TOWER_PREFIXES)) is not None:
                    if _layer_index(local) < tower_layers:
                        tower[local] = checkpoint.get_tensor(name)
                elif (local := _strip(name, _PROJECTOR_PREFIXES)) is not None:
                    projector[local] = checkpoint.get_tensor(name)
    return tower, projector


def checkpoint_tensors(model_dir: Path, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """The checkpoint's tensors whose names start with one of ``prefixes``, prefix removed,
    read one by one: no other tensor (the language model's) is loaded."""
    from safetensors import safe_open

    found: dict[str, Any] = {}
    for path in _weight_files(model_dir):
        with safe_open(str(path), framework="pt") as checkpoint:
            for name in checkpoint.keys():  # noqa: SIM118 (a safe_open handle is no dict)
                if (local := _strip(name, prefixes)) is not None:
                    found[local] = checkpoint.get_tensor(name)
    return found


def _strip(name: str, prefixes: tuple[str, ...]) -> str | None:
    for prefix in prefixes:
        if name.startswith(prefix):
            return name.removeprefix(prefix)
    return None


def _layer_index(local: str) -> int:
    """The encoder layer a tower weight belongs to; -1 for embeddings and norms."""
    parts = local.removeprefix("vision_model.").split(".")
    if parts[:2] == ["encoder", "layers"]:
        return int(parts[2])
    return -1


def _load(module: Any, weights: dict[str, Any], what: str) -> None:
    """Load ``weights`` into ``module``, whichever side has the ``vision_model.`` level.

    transformers 5's CLIP and SigLIP towers are flat (``embeddings...``); 4.x's and the
    checkpoints of vLLM's layout nest them under ``vision_model.``.
    """
    expected = set(module.state_dict())
    state: dict[str, Any] = {}
    for name, tensor in weights.items():
        for candidate in _spellings(name):
            if candidate in expected:
                state[candidate] = tensor
                break
    missing = sorted(expected - state.keys())
    if missing:
        raise ValueError(f"{what}: weights missing from the checkpoint: {missing[:5]}")
    module.load_state_dict(state, strict=True)


def _spellings(name: str) -> Iterator[str]:
    yield name
    if name.startswith("vision_model."):
        yield name.removeprefix("vision_model.")
    else:
        yield "vision_model." + name
