"""The job ledger the chaos soak and the upgrade test read (benchmarks/ledger.py)."""

from benchmarks import ledger


def test_a_job_answered_as_its_worker_was_killed_is_unrecorded_not_lost(tmp_path):
    (tmp_path / "queued-100").write_text("a 10.0\nb 10.0\nc 10.0\n")
    (tmp_path / "answering-200").write_text("a 11.0\nb 11.0\nc 30.0\n")
    (tmp_path / "answered-200").write_text("a 11.1\n")
    book = ledger.read(tmp_path)
    assert book.lost == {"b", "c"}
    # Worker 200 was killed at 11.2: b was in the answer it was sending; c's answer came later, alone.
    assert book.unrecorded({200: 11.2}) == {"b"}
    assert book.unrecorded({300: 11.2}) == set()  # another worker's kill explains nothing
