"""benchmarks/bench_runtime.py runs end to end with tiny sizes and writes every figure it
prints (nothing here is timed: the benchmark's targets are judged on a quiet machine)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("gymnasium")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_runtime  # noqa: E402

TINY = [
    "--quick", "--duration", "0.6", "--window", "0.3", "--spi", "1", "--batch", "64",
    "--min-size", "200", "--timeout", "10", "--actor-s", "0.05", "--rounds", "1",
    "--learner-s", "0.1", "--learner-batches", "32",
]


def test_quick_run_writes_every_part_of_the_report(tmp_path, capsys):
    out = tmp_path / "bench_runtime.json"
    bench_runtime.main([*TINY, "--backends", "inline,threads,processes", "--out", str(out)])
    report = json.loads(out.read_text())

    assert {"args", "machine", "load_before", "load_after", "actor", "ratio", "learner"} <= set(
        report
    )
    loops = {row["loop"]: row for row in report["actor"]["rows"]}
    assert set(loops) == {"raw", "actor+adder", "actor (null adder)", "actor+adder, per-call path"}
    for row in loops.values():
        assert row["steps_per_s"] > 0
        assert set(row) >= {"rounds", "ratio_to_raw", "pass"}
    assert loops["raw"]["ratio_to_raw"] == 1.0
    assert report["actor"]["items_inserted"] > 0  # the adder really wrote into the table

    assert [c["backend"] for c in report["ratio"] if c["error_buffer"] is None] == [
        "inline", "threads", "processes"
    ]
    for case in report["ratio"]:
        assert case["status"] in {"PASS", "FAIL", "TOO SHORT", "ERROR"}
        if case["status"] == "ERROR":
            assert case["error"]
            continue
        assert case["env_steps"] > 0 and case["updates"] > 0
        assert set(case) >= {"windows", "window_min", "window_max", "observed_total",
                             "env_steps_per_s", "updates_per_s", "learner_wait_frac"}
    finished = [c for c in report["ratio"] if c["status"] != "ERROR"]
    assert finished, "every ratio run failed"
    # The limiter holds the ratio over a whole run whatever the window length.
    for case in finished:
        assert case["observed_total"] == pytest.approx(1.0, rel=0.5)

    (learner,) = report["learner"]
    assert learner["batch_size"] == 32
    for key in ("plain_updates_per_s", "iterator_updates_per_s", "run_threads_updates_per_s"):
        assert learner[key] > 0
    assert {len(learner["rounds"]["plain"]), len(learner["rounds"]["iterator"])} == {1}

    printed = capsys.readouterr().out
    for title in ("actor loop", "ratio fidelity", "learner updates/s"):
        assert title in printed


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--backends", "inline,ray", "unknown backends ['ray']"),
        ("--parts", "actor,gpu", "unknown parts ['gpu']"),
    ],
)
def test_unknown_name_is_refused_before_anything_runs(tmp_path, capsys, flag, value, message):
    out = tmp_path / "never.json"
    with pytest.raises(SystemExit):
        bench_runtime.main([flag, value, "--out", str(out)])
    assert message in capsys.readouterr().err
    assert not out.exists()
