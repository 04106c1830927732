import json
import logging

from exitwatch.service.logs import JsonFormatter, TextFormatter


def record(msg: str, *args: object, **fields: object) -> logging.LogRecord:
    rec = logging.LogRecord("exitwatch.reap", logging.INFO, __file__, 1, msg, args, None)
    if fields:
        rec.fields = fields
    return rec


def test_text_lines_stay_one_line_whatever_a_path_holds():
    line = TextFormatter("%(levelname)s %(message)s").format(
        record("reaped workdir %s", "/tmp/x\nINFO exitwatch.reap: reaped\x1b[2J\t")
    )
    assert line == "INFO reaped workdir /tmp/x\\nINFO exitwatch.reap: reaped\\x1b[2J\\t"


def test_json_lines_carry_the_structured_fields():
    line = JsonFormatter().format(record("reaped %s", "workdir /tmp/a\nb", kind="workdir"))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "reaped workdir /tmp/a\nb"
    assert doc["kind"] == "workdir"
    assert doc["level"] == "info"
