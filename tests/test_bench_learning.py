"""benchmarks/learning.py judges each run by its final evaluation (the best is reported
beside it, never in its place) and by the whole process's wall time where the agent has a
budget; nothing here trains."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import learning  # noqa: E402


def run(seed: int, final: float | None, best: float | None, process_s: float, **extra) -> dict:
    return {"seed": seed, "final_eval_return": final, "best_eval_return": best,
            "steps_to_target": 5_000 if best is not None and best >= 475 else None,
            "process_s": process_s, "wall_s": process_s - 5, "cpu_s": process_s,
            "load_avg_1m_end": 1.0, "env_steps": 50_000, **extra}


def test_a_run_that_reached_the_target_and_then_forgot_fails():
    runs = [run(1, 500.0, 500.0, 40.0), run(2, 337.7, 500.0, 40.0)]
    verdict = learning.judge("dqn", runs)
    assert [r["passed"] for r in verdict["runs"]] == [True, False]
    assert verdict["passed"] == verdict["final_ok"] == 1 and verdict["seeds"] == 2
    assert verdict["final_eval_min"] == 337.7 and verdict["best_eval_min"] == 500.0
    assert "final below target" in learning.run_line("dqn", verdict["runs"][1])


def test_the_wall_budget_counts_where_the_agent_has_one_and_errors_fail():
    dqn = learning.judge("dqn", [run(1, 500.0, 500.0, 75.0), run(2, None, None, 3.0, error=["x"])])
    assert dqn["passed"] == 0 and dqn["final_ok"] == 1 and dqn["time_ok"] == 1
    assert "over the wall budget" in learning.run_line("dqn", dqn["runs"][0])
    sac = learning.judge("sac", [run(1, -150.0, -120.0, 500.0) | {"env_steps": 20_000}])
    assert sac["passed"] == 1 and sac["time_ok"] == 1
