import cache_actor


def test_public_names() -> None:
    assert cache_actor.__all__ == sorted(cache_actor.__all__)
    assert set(cache_actor.__all__) >= {
        "CacheActor",
        "CacheConfig",
        "Lookup",
        "Outcome",
        "CacheStats",
        "CacheError",
        "CacheRecursionError",
        "ComputeTimeout",
        "CacheOverloaded",
        "CacheActorDead",
    }
    assert all(hasattr(cache_actor, name) for name in cache_actor.__all__)


def test_error_tree() -> None:
    for error in (
        cache_actor.CacheRecursionError,
        cache_actor.ComputeTimeout,
        cache_actor.CacheOverloaded,
        cache_actor.CacheActorDead,
    ):
        assert issubclass(error, cache_actor.CacheError)
    assert issubclass(cache_actor.ComputeTimeout, TimeoutError)


def test_imports_nothing_of_the_service() -> None:
    import subprocess
    import sys

    # only what importing cache_actor added: the venv's start-up hooks may import other things
    code = (
        "import sys; before = set(sys.modules); import cache_actor; "
        "banned = ('grpc', 'vllm', 'services', 'torch'); "
        "bad = [m for m in set(sys.modules) - before if m.split('.')[0] in banned]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
