"""The settings tables of docs/service.md, written from the settings themselves.

    services/config  Settings: each field's variable, default and docstring
           │
           ▼
    sections()       one Section per area (engine, cache, ...), one Row per variable
           │
           ▼
    rewrite()        each region between <!-- settings:begin ... --> and <!-- settings:end -->:
                     every section, or the one it names (<!-- settings:begin health ... -->)

A field's docstring is already its help in ``mmgate serve --help`` (pydantic's
``use_attribute_docstrings`` makes it the field's description); the tables print that same text,
so the docs cannot drift from the code. ``make settings-table`` rewrites docs/service.md, and
tests/services/test_settings_table.py fails while it differs from what this writes.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, SecretBytes, SecretStr, TypeAdapter
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from ..config import MiB, Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "service.md"
COMMAND = "make settings-table"
# the name of the section of Settings' own fields (no field of Settings is called that)
SERVER = "server"

_REGION = re.compile(
    r"(?P<begin><!-- settings:begin(?: (?P<section>\w+))? \(.*?\) -->\n)"
    r"(?P<tables>.*?)"
    r"(?P<end><!-- settings:end -->)",
    re.DOTALL,
)
GiB = 1024 * MiB
HOUR = 3600
DAY = 24 * HOUR


@dataclass(frozen=True, slots=True)
class Row:
    env: str
    default: str
    description: str


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    env: str  # the prefix its variables share: MMGATE_ENGINE__
    summary: str
    rows: tuple[Row, ...]


def sections(model: type[BaseSettings] = Settings) -> list[Section]:
    """The model's own fields first, then one section per nested model, in field order."""
    prefix = model.model_config.get("env_prefix", "").upper()
    delimiter = model.model_config.get("env_nested_delimiter") or "__"
    own: list[Row] = []
    nested: list[Section] = []
    for name, field in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        area = _model_of(field)
        if area is None:
            own.append(_row(env, name, field, lead=""))
        else:
            rows = tuple(_rows(area, env + delimiter, delimiter, lead=""))
            nested.append(Section(name, env + delimiter, _text(area.__doc__), rows))
    return [Section(SERVER, prefix, _text(model.__doc__), tuple(own)), *nested]


def render(section: str | None = None) -> str:
    """Every section, each under a line naming it; or, given a name, that section's table alone."""
    found = sections()
    if section is not None:
        chosen = [s for s in found if s.name == section]
        if not chosen:
            names = ", ".join(s.name for s in found)
            raise ValueError(f"no settings section {section!r} (there are: {names})")
        return _table(chosen[0])
    return "\n".join(f"**{s.name}** (`{s.env}*`): {s.summary}\n\n{_table(s)}" for s in found)


def rewrite(text: str) -> str:
    """``text`` with every settings region holding what ``render`` writes now."""
    if _REGION.search(text) is None:
        raise ValueError("no <!-- settings:begin (...) --> ... <!-- settings:end --> region")
    return _REGION.sub(
        lambda match: f"{match['begin']}\n{render(match['section'])}\n{match['end']}", text
    )


def main() -> int:
    text = DOC.read_text()
    DOC.write_text(rewrite(text))
    sys.stdout.write(f"wrote the settings tables of {DOC.relative_to(ROOT)}\n")
    return 0


def _rows(model: type[BaseModel], prefix: str, delimiter: str, lead: str) -> Iterator[Row]:
    for name, field in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        area = _model_of(field)
        if area is None:
            yield _row(env, name, field, lead)
        else:
            # a model inside a section (chaos.decode): its rows carry its own description first
            yield from _rows(area, env + delimiter, delimiter, _sentences(lead, field.description))


def _row(env: str, name: str, field: FieldInfo, lead: str) -> Row:
    return Row(env, _default(name, field), _text(_sentences(lead, field.description)))


def _model_of(field: FieldInfo) -> type[BaseModel] | None:
    """The model a field nests (its variables are the model's, under the delimiter), if any."""
    annotation = field.annotation
    if isinstance(annotation, type) and get_origin(annotation) is None:
        return annotation if issubclass(annotation, BaseModel) else None
    return None


def _default(name: str, field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True, validated_data={})
    choices = _choices(field.annotation)
    others = [c for c in choices if c != value]
    also = f" (or {', '.join(f'`{c}`' for c in others)})" if others else ""
    if value is None:
        return "unset" + also
    if isinstance(value, SecretStr | SecretBytes):
        return "(secret)"  # a secret is never printed, not even a default one
    return f"`{_value(field, value)}`{_scale(name, value)}{also}"


def _value(field: FieldInfo, value: Any) -> str:
    """The default as one would write the variable."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return value or '""'
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, Path):
        # a default under the home folder differs per user: shown as the shell writes it
        home = Path.home()
        return f"~/{value.relative_to(home)}" if value.is_relative_to(home) else str(value)
    # lists and mappings: the JSON the variable takes
    adapter: TypeAdapter[Any] = TypeAdapter(field.annotation or type(value))
    return json.dumps(adapter.dump_python(value, mode="json"))


def _scale(name: str, value: Any) -> str:
    """Byte counts in MiB or GiB, long durations in hours or days, beside the exact value."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return ""
    if name.endswith("bytes") and value % MiB == 0:
        return f" ({value // GiB:g} GiB)" if value % GiB == 0 else f" ({value // MiB:g} MiB)"
    if name.endswith("seconds") and value % HOUR == 0:
        days = value // DAY
        return f" ({days:g} days)" if value % DAY == 0 and days > 1 else f" ({value // HOUR:g} h)"
    return ""


def _choices(annotation: Any) -> tuple[str, ...]:
    """The values a Literal field (or an optional one) takes."""
    if get_origin(annotation) is Literal:
        return tuple(str(arg) for arg in get_args(annotation))
    for arg in get_args(annotation):
        if get_origin(arg) is Literal:
            return tuple(str(value) for value in get_args(arg))
    return ()


def _sentences(lead: str, text: str | None) -> str:
    if not lead:
        return text or ""
    return f"{lead if lead.endswith('.') else lead + '.'} {text or ''}".strip()


def _text(docstring: str | None) -> str:
    """A docstring as one line of a Markdown table cell."""
    text = " ".join((docstring or "").split()).replace("``", "`")
    # `<` outside code would open an HTML tag, `|` anywhere a new cell
    parts = re.split(r"(`[^`]*`)", text)
    parts = [p if p.startswith("`") else p.replace("<", "&lt;") for p in parts]
    return "".join(parts).replace("|", "\\|")


def _table(section: Section) -> str:
    lines = ["| env | default | description |", "|---|---|---|"]
    lines += [f"| `{row.env}` | {row.default} | {row.description} |" for row in section.rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
