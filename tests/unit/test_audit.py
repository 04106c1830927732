import json

from exitwatch.agent import audit


def test_rotation_keeps_one_old_file_and_reads_oldest_first(tmp_path):
    path = tmp_path / "state" / "audit.jsonl"
    log = audit.AuditLog(str(path), max_bytes=4096)
    for n in range(200):
        log.write({"time": 1000.0 + n, "what": f"container {n}", "pad": "x" * 40})
    log.close()
    assert path.stat().st_size <= 4096
    assert (tmp_path / "state" / "audit.jsonl.1").stat().st_size <= 4096
    entries = list(audit.read(str(path)))
    times = [e["time"] for e in entries]
    assert times == sorted(times)
    assert times[-1] == 1199.0
    assert [e["time"] for e in audit.read(str(path), since=1190.0)] == [
        1190.0 + n for n in range(10)
    ]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_read_skips_what_is_not_an_entry(tmp_path):
    path = tmp_path / "audit.jsonl"
    good = {"time": 5.0, "what": "workdir /tmp/x"}
    path.write_text(
        "\n".join(["not json", "[1, 2]", '{"time": "yesterday"}', json.dumps(good), "{"]) + "\n"
    )
    assert list(audit.read(str(path))) == [good]
    assert list(audit.read(str(tmp_path / "missing.jsonl"))) == []


def test_a_failing_disk_warns_once_and_never_raises(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = audit.AuditLog(str(blocker / "audit.jsonl"), max_bytes=4096)  # parent is a file
    log.write({"time": 1.0})
    log.write({"time": 2.0})
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1
