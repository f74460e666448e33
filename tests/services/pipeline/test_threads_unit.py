"""The thread pools' CPUs: encodes held to ``threads.encode_cpus``, other work left alone."""

from __future__ import annotations

import os
import threading

import pytest

from services.config import ThreadSettings
from services.pipeline.threads import ThreadPools

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's"
)


def where() -> tuple[int, frozenset[int]]:
    return threading.get_ident(), frozenset(os.sched_getaffinity(0))


async def test_an_encode_runs_on_the_chosen_cpu_and_its_thread_is_set_back() -> None:
    everywhere = frozenset(os.sched_getaffinity(0))
    chosen = frozenset({max(everywhere)})
    threads = ThreadPools(ThreadSettings(encode=1, hash=1, decode=1, render=1, encode_cpus=chosen))

    thread, cpus = await threads.run("encode", where)
    assert cpus == chosen
    async with threads.capacity("encode"):  # the batcher's way in
        assert (await threads.in_thread("encode", where))[1] == chosen
    # other pools, and the same worker thread afterwards, run where the process runs
    seen = {await threads.run("render", where) for _ in range(4)}
    assert {c for _, c in seen} == {everywhere}
    assert thread in {t for t, _ in seen}  # one of them reused the encode's thread


async def test_without_the_setting_an_encode_runs_where_the_process_runs() -> None:
    threads = ThreadPools(ThreadSettings())
    assert (await threads.run("encode", where))[1] == frozenset(os.sched_getaffinity(0))


@pytest.mark.parametrize("cpu", [4095, 100_000])
def test_a_cpu_the_process_cannot_use_is_refused_at_start(cpu: int) -> None:
    with pytest.raises(ValueError, match=r"threads\.encode_cpus: CPUs \[\d+\] are not available"):
        ThreadPools(ThreadSettings(encode_cpus=frozenset({cpu})))
