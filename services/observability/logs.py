"""mmgate's log lines, as text or one JSON object a line, with the ids of the trace they belong to.

    log.info(...) in a traced call ─▶ TraceContextFilter: record.trace_id, record.span_id
                                   ─▶ TextFormatter  "... mmgate.media: msg trace_id=… span_id=…"
                                   or JsonFormatter  {"time", "level", "logger", "message",
                                                      "trace_id", "span_id"}

The ids are those of the span current where the record is made (a cache lookup's, a server
span's): a log line leads to its trace in Jaeger and back. Outside a traced call there are none.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal, final

from opentelemetry import trace

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@final
class TraceContextFilter(logging.Filter):
    """Sets ``trace_id`` and ``span_id`` (hex, or "" outside a span) on every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        else:
            record.trace_id = record.span_id = ""
        return True


@final
class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        trace_id = getattr(record, "trace_id", "")
        if not trace_id:
            return line
        return f"{line} trace_id={trace_id} span_id={getattr(record, 'span_id', '')}"


@final
class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ("trace_id", "span_id"):
            if value := getattr(record, name, ""):
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def log_handler(fmt: Literal["text", "json"]) -> logging.Handler:
    """A stderr handler writing ``fmt``, with the trace ids of each record."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    return handler


def configure_logging(level: str, fmt: Literal["text", "json"]) -> None:
    """The process's logging: one stderr handler on the root logger."""
    logging.basicConfig(level=level, handlers=[log_handler(fmt)])


__all__ = [
    "JsonFormatter",
    "TextFormatter",
    "TraceContextFilter",
    "configure_logging",
    "log_handler",
]
