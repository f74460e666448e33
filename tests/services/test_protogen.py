"""The committed services/proto must be what proto/ generates (`make proto` refreshes it)."""

import filecmp
from pathlib import Path

from services import protogen


def test_generated_code_is_current(tmp_path: Path) -> None:
    protogen.generate(tmp_path)
    generated = tmp_path / protogen.PACKAGE
    committed = protogen.ROOT / protogen.PACKAGE
    names = sorted(p.relative_to(generated) for p in generated.rglob("*") if p.is_file())
    assert names == sorted(
        p.relative_to(committed)
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    stale = [str(n) for n in names if not filecmp.cmp(generated / n, committed / n, shallow=False)]
    assert stale == [], "run `make proto` and commit services/proto"
