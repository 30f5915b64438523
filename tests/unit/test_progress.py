"""The long commands' progress off a terminal: a plain line at most every LOG_EVERY_S seconds, with an ETA."""

from __future__ import annotations

from dspark_lightning import progress


def test_off_a_terminal_a_progress_line_is_written_every_interval(monkeypatch, capsys):
    now = [1000.0]
    monkeypatch.setattr(progress, "monotonic", lambda: now[0])
    with progress.progress_bar("regenerate", total=10, unit="records") as advance:
        for _ in range(4):  # 30 s per record: a line after the 2nd (60 s) and the 4th (120 s) record
            now[0] += 30.0
            advance()
        now[0] += 59.0
        advance(2)  # 59 s after the last line: none
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("regenerate:")]
    # 2 of 10 in 60 s leave 8 at 30 s each; 4 of 10 in 120 s leave 6
    assert lines == [
        "regenerate: 2/10 records, 1:00 elapsed, ETA 4:00",
        "regenerate: 4/10 records, 2:00 elapsed, ETA 3:00",
    ]


def test_a_progress_line_without_a_total_has_no_eta():
    assert progress.progress_line("cache", 5, None, "samples", 3725.0) == "cache: 5 samples, 1:02:05 elapsed"
    assert progress.progress_line("decode", 0, 8, "", 61.0) == "decode: 0/8, 1:01 elapsed"
