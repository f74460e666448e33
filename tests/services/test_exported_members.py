"""The public names of services' packages: sorted, complete, and each one there."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ["services.client", "services.models", "services.pipeline.media", "services.types"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    # sorted as ruff sorts __all__: CONSTANTS, then Classes, then functions
    kind = {True: 0, False: 1}
    assert exported == sorted(exported, key=lambda n: (kind[n.isupper()], n[0].islower(), n))
    assert [n for n in exported if not hasattr(module, n)] == []
    public = {n for n in vars(module) if not n.startswith("_") and not n.islower()}
    # every public class and constant is exported (functions and submodules are lowercase)
    assert public - set(exported) - {"Any", "Final", "Literal", "Mapping"} == set()
