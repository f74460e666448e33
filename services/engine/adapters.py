"""LoRA adapters the engine serves: checked, copied aside, handed to vLLM, dropped when unused.

    load(name, folder) ─▶ copy aside, hashing (the digest) ─▶ mmgate's checks: config, rank, the
        modules and their shapes against the model ─▶ vLLM add_lora ─▶ served[name]
    EngineRequest.adapter (name, digest) ─▶ acquire: that very load ─▶ LoRARequest;
        release when the run ends
    unload(name), or a load under the same name ─▶ retired: no new request takes it; dropped
        from the engine, and its copy deleted, after its last run

Why a copy: vLLM reads an adapter's files again whenever it reloads one it evicted, and its prefix
cache keys blocks by the adapter's name and path. A private copy per load, and a name with the
digest in it, bind what the engine serves to the digest in mmgate's cache keys whatever then
happens to the folder.

Why a null adapter in the last slot, on the CPU: vLLM's CPU LoRA kernels (lora/ops/torch_ops)
pick each row's weights by slot index, and a base-model row's index, -1, picks the last slot: in a
batch with adapters, a base-model request was answered through whichever adapter sat there. An
all-zero adapter is pinned in the last slot (B A x = 0: the base model's answer), placed there by
filling the slots before it with placeholders, loaded and removed at start (vLLM gives a new
adapter the first free slot, and a pinned one is never evicted). Base-model requests then name no
adapter, so a batch of them alone skips the LoRA kernels; sending them through the null adapter
instead was as exact but cost 2.3x their speed (docs/benchmarks.md, "Adapters").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, final

from ..config import LORA_RANKS, EngineSettings
from ..errors import AdapterNotFound, AdapterRefused
from ..models.adapters import adapter_shapes
from ..types import AdapterRef, AdapterStats
from .adapter_files import (
    AdapterCheck,
    checked_name,
    config_rank,
    copy_adapter,
    engine_words,
    folder_under,
    write_null,
)

log = logging.getLogger("mmgate.adapters")

# adapters' names a metric keeps apart; beyond them, "other"
MAX_LABELS: Final = 64
BASE_LABEL: Final = "base"


class LoraEngine(Protocol):
    """What the set needs of vLLM's AsyncLLM."""

    async def add_lora(self, lora_request: Any) -> bool: ...

    async def remove_lora(self, lora_id: int) -> bool: ...

    async def pin_lora(self, lora_id: int) -> bool: ...


@final
@dataclass(slots=True, eq=False)
class Served:
    """One load of an adapter: its reference, its id in the engine, its copy, its runs."""

    ref: AdapterRef
    lora_id: int
    path: Path
    running: int = 0
    retired: bool = False

    @property
    def lora_name(self) -> str:
        # vLLM's prefix-cache blocks hash the name: another load, another name
        return f"{self.ref.name}@{self.ref.digest[:16]}"

    def request(self) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(self.lora_name, self.lora_id, str(self.path))


def planned_rank(settings: EngineSettings) -> int:
    """max_lora_rank: the setting, else the smallest vLLM rank holding every configured one."""
    if settings.max_lora_rank is not None:
        return settings.max_lora_rank
    highest = max((config_rank(folder) for folder in settings.adapters.values()), default=0)
    return next(r for r in LORA_RANKS if r >= max(highest, 16))


def planned_slots(settings: EngineSettings) -> int:
    """max_loras: the setting, else the adapters configured at start, from 1 to 8."""
    if settings.max_loras is not None:
        return settings.max_loras
    return min(max(len(settings.adapters), 1), 8)


@final
class AdapterSet:
    """The adapters one engine serves, by name; every change happens on the event loop."""

    def __init__(
        self,
        settings: EngineSettings,
        engine: Callable[[], LoraEngine],
        folder: Path,
        *,
        text_config: dict[str, Any],
        max_rank: int,
        language_only: bool,
        multimodal: bool,
    ) -> None:
        self.settings = settings
        # the running engine, asked for at each use: a reference kept here would keep a stopped
        # engine alive until the interpreter's exit, where its finaliser fails
        self.engine = engine
        self.folder = folder  # the copies, one sub-folder per load
        # embeddings mode (language_only): mmgate runs the vision tower and projector, so no
        # adapter may touch them
        self.check = AdapterCheck(
            adapter_shapes(text_config),
            int(text_config["num_hidden_layers"]),
            max_rank,
            language_only,
        )
        # where the language model's layers are, in PEFT's names (the null adapter's)
        self.layer_prefix = "model.language_model.layers" if multimodal else "model.layers"
        self.served: dict[str, Served] = {}
        self._draining: set[Served] = set()  # retired, with runs still going
        self._ids = 0
        self._loading = asyncio.Lock()  # one load at a time: a name's check and swap stay whole
        self._drops: set[asyncio.Task[None]] = set()
        self.null: Served | None = None
        # distinct adapters the engine may run at once (None: the engine's scheduler keeps to
        # its slots itself); on the CPU the null adapter holds one slot the scheduler counts as
        # free, and a step with one adapter more than the free slots failed the engine for
        # every tenant (a KeyError in vLLM's LoRA mapping)
        self.slots: int | None = None
        self._active: set[Served] = set()
        self._slot_waiters: list[asyncio.Future[None]] = []
        self.requests: Counter[str] = Counter()
        self.generated_tokens: Counter[str] = Counter()
        self.loads: Counter[str] = Counter()

    # ── loads ────────────────────────────────────────────────────────────────────────────────

    async def start(self, *, null_slot: int | None) -> None:
        """The CPU's null adapter in slot ``null_slot`` (the last; None: none), then the
        configured adapters (a bad one stops the start)."""
        if null_slot is not None:
            self.null = await self._null(null_slot)
            self.slots = null_slot  # the slots before the null adapter's
        for name, folder in self.settings.adapters.items():
            try:
                await self.load(name, folder)
            except AdapterRefused as exc:
                raise ValueError(f"adapter {name} ({folder}): {exc.description}") from None

    async def load_from_root(self, name: str, path: str) -> tuple[AdapterRef, bool]:
        """An admin's load (LoadAdapter): ``path`` must lead to a folder under the adapter root."""
        try:
            folder = folder_under(self.settings.adapter_root, path)
            checked_name(name)
        except AdapterRefused:
            self.loads["refused"] += 1
            raise
        return await self.load(name, folder, root=self.settings.adapter_root)

    async def load(
        self, name: str, folder: Path, *, root: Path | None = None
    ) -> tuple[AdapterRef, bool]:
        """Serve ``folder`` as ``name`` (replacing a load of that name): its reference, and
        whether one was replaced; its files must lie under ``root`` where one is given.
        Refused (AdapterRefused): nothing changed."""
        async with self._loading:
            try:
                ref, replaced = await self._load(name, folder, root)
            except AdapterRefused:
                self.loads["refused"] += 1
                raise
            self.loads["loaded"] += 1
            return ref, replaced

    async def _load(self, name: str, folder: Path, root: Path | None) -> tuple[AdapterRef, bool]:
        current = self.served.get(name)
        if current is None and len(self.served) >= self.settings.max_adapters:
            raise AdapterRefused(
                "name",
                f"this server serves {self.settings.max_adapters} adapters already"
                " (MMGATE_ENGINE__MAX_ADAPTERS): unload one first",
            )
        lora_id = self._next_id()
        copy = self.folder / str(lora_id)
        try:
            digest = await asyncio.to_thread(copy_adapter, folder, copy, root)
            if current is not None and current.ref.digest == digest:
                await asyncio.to_thread(shutil.rmtree, copy, True)
                return current.ref, False  # the same bytes: nothing to change
            rank = await asyncio.to_thread(self.check.rank_of, copy)
            served = Served(AdapterRef(name, digest, rank), lora_id, copy)
            await self._add(served)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, copy, True)
            raise
        if current is not None:
            self._retire(current)
        self.served[name] = served
        log.info("adapter %s served: rank %d, digest %s", name, rank, digest[:16])
        return served.ref, current is not None

    async def _add(self, served: Served) -> None:
        try:
            await self.engine().add_lora(served.request())
        except Exception as exc:  # noqa: BLE001 - the engine's refusal, in its own words, logged
            log.warning("the engine refused adapter %s: %s", served.ref.name, exc)
            words = engine_words(exc)
            raise AdapterRefused("path", f"the engine could not load it: {words}") from None

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def _null(self, slot: int) -> Served:
        folder = self.folder / "null"
        await asyncio.to_thread(
            write_null, folder, self.layer_prefix, self.check.layers, self.check.shapes["q_proj"]
        )
        engine = self.engine()
        # placeholders in the slots before it, so that the null adapter takes this one
        placeholders = [
            Served(AdapterRef("", f"placeholder-{i}", 1), self._next_id(), folder)
            for i in range(slot)
        ]
        for placeholder in placeholders:
            await engine.add_lora(placeholder.request())
        served = Served(AdapterRef("", "null", 1), self._next_id(), folder)
        await engine.add_lora(served.request())
        await engine.pin_lora(served.lora_id)
        for placeholder in placeholders:
            await engine.remove_lora(placeholder.lora_id)
        return served

    # ── unloads ──────────────────────────────────────────────────────────────────────────────

    def unload(self, name: str) -> int:
        """Stop serving ``name``: the runs still going on it, which finish on it."""
        served = self.served.pop(name, None)
        if served is None:
            raise AdapterNotFound(name)
        self._retire(served)
        log.info("adapter %s unloaded; %d requests finish on it", name, served.running)
        return served.running

    def _retire(self, served: Served) -> None:
        served.retired = True
        if served.running:
            self._draining.add(served)
        else:
            self._drop(served)

    def _drop(self, served: Served) -> None:
        self._draining.discard(served)
        task = asyncio.get_running_loop().create_task(self._remove(served))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def _remove(self, served: Served) -> None:
        try:
            await self.engine().remove_lora(served.lora_id)
        except Exception:  # noqa: BLE001 - a dead engine holds nothing any more
            log.warning("could not remove adapter %s from the engine", served.ref.name)
        await asyncio.to_thread(shutil.rmtree, served.path, True)

    async def close(self) -> None:
        """Wait for removals under way (shutdown)."""
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._drops, return_exceptions=True)

    # ── runs ─────────────────────────────────────────────────────────────────────────────────

    def resolve(self, name: str) -> AdapterRef:
        """The adapter served as ``name`` now (AdapterNotFound: none)."""
        served = self.served.get(name)
        if served is None:
            raise AdapterNotFound(name)
        return served.ref

    async def acquire(self, ref: AdapterRef | None) -> Served | None:
        """The load a run goes through, held until ``release`` (None: the base model). A load
        unloaded since the request resolved it still serves it while it drains; one already
        dropped is AdapterNotFound. Waits (bounded by the caller's deadline) while every slot
        the engine has holds another adapter's runs."""
        if ref is None:
            self.requests[BASE_LABEL] += 1
            return None
        served = self._served_as(ref)
        while self.slots is not None and served not in self._active:
            if len(self._active) < self.slots:
                break
            waiter = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(waiter)
            try:
                await waiter
            finally:
                self._slot_waiters.remove(waiter)
            served = self._served_as(ref)  # it may have been unloaded meanwhile
        self._active.add(served)
        served.running += 1
        self.requests[self._label(ref.name)] += 1
        return served

    def _served_as(self, ref: AdapterRef) -> Served:
        served = self.served.get(ref.name)
        if served is None or served.ref.digest != ref.digest:
            served = next((d for d in self._draining if d.ref == ref), None)
            if served is None:
                raise AdapterNotFound(ref.name)
        return served

    def release(self, served: Served | None, tokens: int) -> None:
        if served is None:
            self.generated_tokens[BASE_LABEL] += tokens
            return
        self.generated_tokens[self._label(served.ref.name)] += tokens
        served.running -= 1
        if served.running == 0:
            self._active.discard(served)
            for waiter in self._slot_waiters:  # each checks again: one of them gets the slot
                if not waiter.done():
                    waiter.set_result(None)
        if served.retired and served.running == 0:
            self._drop(served)

    def _label(self, name: str) -> str:
        if name in self.requests or len(self.requests) < MAX_LABELS:
            return name
        return "other"

    def stats(self) -> AdapterStats:
        return AdapterStats(
            requests=dict(self.requests),
            generated_tokens=dict(self.generated_tokens),
            served=len(self.served),
            loads=dict(self.loads),
            running=tuple(sorted(name for name, s in self.served.items() if s.running)),
            max_loras=planned_slots(self.settings),
        )


__all__ = [
    "BASE_LABEL",
    "AdapterSet",
    "LoraEngine",
    "Served",
    "planned_rank",
    "planned_slots",
]
