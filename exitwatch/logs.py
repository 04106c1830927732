"""Log lines on stderr, one per event: readable text, or JSON for log shippers."""

from __future__ import annotations

import json
import logging
import sys


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a record's `fields` (e.g. a removal's) become keys."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup(fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
