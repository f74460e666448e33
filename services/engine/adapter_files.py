"""An adapter's files: where a load may read them from, the copy it makes, and mmgate's checks.

    LoadAdapter(name, path) ─▶ checked_name, folder_under (the adapter root, links followed)
        ─▶ copy_adapter: the two files (regular files, under the root once links are followed)
           copied aside, hashed (the digest)
        ─▶ AdapterCheck.rank_of: the config's rank, every weight's module, layer and shape
           against the model, nothing outside the language model in embeddings mode

Every refusal is AdapterRefused, in mmgate's words, before the engine sees the adapter.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, final

from ..config import ADAPTER_NAME
from ..errors import AdapterRefused

CONFIG_FILE: Final = "adapter_config.json"
WEIGHTS_FILE: Final = "adapter_model.safetensors"
# the language model's layers, in the names PEFT gives them (Llama; LLaVA's old and new layouts)
_LANGUAGE: Final = frozenset({"model", "model.language_model", "language_model.model"})
_KEY = re.compile(
    r"base_model\.model\.(?P<prefix>.+?)\.layers\.(?P<layer>\d+)\."
    r"(?:self_attn|mlp)\.(?P<module>\w+)\.lora_(?P<half>[AB])\.weight"
)
_OUTSIDE_LANGUAGE: Final = ("vision_tower", "multi_modal_projector")
_CHUNK: Final = 1 << 20
NO_ADAPTER_ROOT: Final = "this server loads no adapters at run time (no adapter root is set)"


def config_rank(folder: Path) -> int:
    """The rank an adapter's config gives (0 where it gives none: its load says why)."""
    try:
        with adapter_file(folder, CONFIG_FILE, None) as reading:
            rank = json.loads(reading.read()).get("r")
    except (OSError, ValueError, AttributeError):  # AdapterRefused is a ValueError
        return 0
    return rank if isinstance(rank, int) else 0


def adapter_file(folder: Path, name: str, root: Path | None) -> BinaryIO:
    """``folder``'s file ``name`` open for reading, refused unless it is a regular file and, where
    ``root`` is given, lies under it once links are followed."""
    try:
        path = (folder / name).resolve()
    except (OSError, RuntimeError):  # a name too long, a loop of links
        raise AdapterRefused("path", f"{name} cannot be read") from None
    if root is not None and not path.is_relative_to(root.resolve()):
        # the folder is under the root, but a link in it would serve a file from anywhere
        raise AdapterRefused("path", f"{name} leads out of the server's adapter root")
    try:
        # O_NONBLOCK: opening a FIFO otherwise waits for a writer, and the worker thread stuck
        # there is lost to every later load; O_NOFOLLOW: the path judged is the file opened
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise AdapterRefused("path", f"the folder holds no {name}") from None
    except OSError as exc:
        raise AdapterRefused("path", f"{name} cannot be read ({exc.strerror})") from None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:  # a folder, a FIFO, a device: nothing an adapter is made of
        os.close(fd)
        raise AdapterRefused("path", f"{name} is not a regular file")
    return os.fdopen(fd, "rb")


@final
@dataclass(frozen=True, slots=True)
class AdapterCheck:
    """What an adapter of the served model must fit: its projections' (in, out) features, its
    layers, the highest rank, and whether only the language model may be adapted."""

    shapes: dict[str, tuple[int, int]]
    layers: int
    max_rank: int
    language_only: bool

    def rank_of(self, copy: Path) -> int:
        """mmgate's own checks, before vLLM sees the adapter: its rank, and every weight's
        module, layer and shape against the model (wrong shapes would fail the engine's step,
        not the load). Returns the rank."""
        from safetensors import safe_open

        config = json.loads((copy / CONFIG_FILE).read_text())
        rank = config.get("r") if isinstance(config, dict) else None
        if not isinstance(rank, int) or rank <= 0:
            raise AdapterRefused("path", f"{CONFIG_FILE} gives no rank r")
        if config.get("use_dora"):
            raise AdapterRefused("path", "DoRA adapters are not served")
        try:
            with safe_open(str(copy / WEIGHTS_FILE), framework="pt") as weights:
                shapes = {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118 - safe_open is not a mapping
        except Exception:  # noqa: BLE001 - any unreadable file is one answer
            raise AdapterRefused("path", f"{WEIGHTS_FILE} is not a safetensors file") from None
        if not shapes:
            raise AdapterRefused("path", f"{WEIGHTS_FILE} holds no weights")
        highest = max([rank, *(self._checked(key, shape) for key, shape in shapes.items())])
        if highest > self.max_rank:
            raise AdapterRefused(
                "path",
                f"rank {highest} is above this server's maximum, {self.max_rank}"
                " (MMGATE_ENGINE__MAX_LORA_RANK)",
            )
        return highest

    def _checked(self, key: str, shape: tuple[int, ...]) -> int:
        """One weight's rank, once its module, layer and shape fit the model."""
        if self.language_only and any(part in key for part in _OUTSIDE_LANGUAGE):
            raise AdapterRefused(
                "path",
                f"{key.removeprefix('base_model.model.')} is outside the language model; in"
                " embeddings mode mmgate runs the vision tower and projector itself",
            )
        found = _KEY.fullmatch(key)
        if found is None or found["prefix"] not in _LANGUAGE or found["module"] not in self.shapes:
            return 0  # not one mmgate knows the shape of: vLLM's own check decides
        layer, module = int(found["layer"]), found["module"]
        if layer >= self.layers:
            raise AdapterRefused(
                "path", f"{module} of layer {layer}: the model has {self.layers} layers"
            )
        fan_in, fan_out = self.shapes[module]
        rank = shape[0] if found["half"] == "A" else shape[-1]
        expected = (rank, fan_in) if found["half"] == "A" else (fan_out, rank)
        if len(shape) != 2 or shape != expected:
            raise AdapterRefused(
                "path",
                f"{module} of layer {layer}: lora_{found['half']} is"
                f" {'x'.join(map(str, shape))}, the model needs {expected[0]}x{expected[1]}",
            )
        return rank


def checked_name(name: str) -> str:
    """An adapter's name as a load gives it: what a metric label and a log line can hold."""
    if re.fullmatch(ADAPTER_NAME, name) is None:
        raise AdapterRefused("name", "1 to 64 letters, digits, '.', '-' or '_'")
    return name


def folder_under(root: Path | None, path: str) -> Path:
    """``path`` (absolute, or relative to ``root``) as a folder inside ``root``, links followed:
    a link or ``..`` pointing out of the root is refused like any other path outside it."""
    if root is None:
        raise AdapterRefused("path", NO_ADAPTER_ROOT)
    if not path or "\0" in path:
        raise AdapterRefused("path", "a folder under the server's adapter root is required")
    base = root.resolve()
    try:
        folder = (base / path).resolve()
        inside = folder.is_relative_to(base)
        found = inside and folder.is_dir()
    except (OSError, RuntimeError):  # a name too long, a loop of links
        raise AdapterRefused("path", "not a folder that can be read") from None
    if not inside:
        raise AdapterRefused("path", "not under the server's adapter root")
    if not found:
        raise AdapterRefused("path", "no such folder under the server's adapter root")
    return folder


def copy_adapter(source: Path, copy: Path, root: Path | None = None) -> str:
    """Copy an adapter's two files into ``copy``, hashing them: the adapter's digest. Where
    ``root`` is given (a load from the adapter root), each file must lie under it."""
    digest = hashlib.sha256()
    copy.mkdir(parents=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        try:
            with adapter_file(source, name, root) as reading, (copy / name).open("wb") as writing:
                digest.update(f"{name}\0".encode())
                while chunk := reading.read(_CHUNK):
                    digest.update(chunk)
                    writing.write(chunk)
        except OSError as exc:
            raise AdapterRefused("path", f"{name} cannot be read ({exc.strerror})") from None
    try:
        json.loads((copy / CONFIG_FILE).read_text())
    except (UnicodeDecodeError, ValueError):
        raise AdapterRefused("path", f"{CONFIG_FILE} is not JSON") from None
    return "sha256:" + digest.hexdigest()


def write_null(folder: Path, prefix: str, layers: int, q_proj: tuple[int, int]) -> None:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    fan_in, fan_out = q_proj
    tensors = {}
    for layer in range(layers):
        module = f"base_model.model.{prefix}.{layer}.self_attn.q_proj"
        tensors[f"{module}.lora_A.weight"] = torch.zeros(1, fan_in)
        tensors[f"{module}.lora_B.weight"] = torch.zeros(fan_out, 1)
    save_file(tensors, folder / WEIGHTS_FILE)
    config = {"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["q_proj"]}
    (folder / CONFIG_FILE).write_text(json.dumps(config))


def engine_words(exc: BaseException) -> str:
    """vLLM's reason without its wrapping ("Call to add_lora method failed: Worker failed with
    error '...', please check the stack trace above") or the copy's path."""
    text = str(exc)
    inner = re.search(r"error '(.*)'", text, re.S)
    text = inner.group(1) if inner else text
    text = re.sub(r"(/[^\s,'\]]+)+", "<adapter>", text)
    return text.splitlines()[0][:300] if text else "no reason given"


__all__ = [
    "CONFIG_FILE",
    "NO_ADAPTER_ROOT",
    "WEIGHTS_FILE",
    "AdapterCheck",
    "adapter_file",
    "checked_name",
    "config_rank",
    "copy_adapter",
    "engine_words",
    "folder_under",
    "write_null",
]
