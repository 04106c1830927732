"""`exitwatch status`'s parts that need no agent: the --since parser, on its own and on
the command line, and the text view of a removal waiting to retry. engine/test_status.py
has the status of real agents."""

from __future__ import annotations

import time
from datetime import datetime

import click
import pytest

from exitwatch.cli import _since
from exitwatch.service.status.text import render

from support.cli import status


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800)]
)
def test_since_parses_durations_back_from_now(text, seconds):
    before = time.time()
    value = _since(text)
    after = time.time()
    assert before - seconds <= value <= after - seconds


def test_since_parses_a_date_in_local_time():
    assert _since("2026-11-30T08:00") == datetime(2026, 11, 30, 8, 0).timestamp()
    assert _since("2026-11-30") == datetime(2026, 11, 30).timestamp()


@pytest.mark.parametrize("text", ["", "h", "1.5h", "-5m", "5w", "12 h", "yesterday"])
def test_since_refuses_what_is_neither_a_duration_nor_a_date(text):
    with pytest.raises(click.BadParameter, match="neither a duration"):
        _since(text)


def test_since_on_the_command_line_is_one_line(tmp_path):
    # No agent and no engine: the scan that stands in for the agent finds nothing.
    config = tmp_path / "config.toml"
    config.write_text(
        f'workdir_roots = ["{tmp_path}"]\ndocker_host = "unix://{tmp_path}/no-engine.sock"\n'
    )
    done = status(str(tmp_path / "none.sock"), "--config", str(config), "--since", "soon")
    assert done.returncode == 2
    assert "Invalid value for --since: 'soon' is neither a duration" in done.stderr
    assert "Traceback" not in done.stderr


def test_render_shows_a_removal_waiting_to_retry():
    doc = {
        "agent": None,
        "pending": [
            {
                "owner": "b:1:2",
                "death": "process gone",
                "what": ["workdir /tmp/x"],
                "attempt": 2,
                "state": "waiting to retry",
            }
        ],
    }
    assert "  b:1:2 (process gone): workdir /tmp/x [attempt 2, waiting to retry]" in (
        render(doc).splitlines()
    )
