"""Evaluations in a process of their own: when they run, what they return, how they fail."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlreplay.errors import ComponentFailedError, InvalidArgumentError, ReplayTimeoutError
from rlreplay.runtime.evaluator import EvaluatorProcess
from rlreplay.runtime.report import Evaluations


def doubled(params: dict) -> float:
    return 2.0 * float(params["w"])


def pid_of_evaluator(params: dict) -> float:
    return float(os.getpid())


def raises(params: dict) -> float:
    raise ValueError(f"no score for w={params['w']}")


def sleeps(params: dict, seconds: float) -> float:
    time.sleep(seconds)
    return 0.0


def test_evaluations_run_every_n_steps_and_on_the_final_row_with_the_newest_weights():
    with Evaluations(doubled, every=1_000) as hook:
        rows = [(500, False, 1), (1_000, False, 2), (1_200, False, 3), (3_100, False, 4),
                (3_200, True, 5)]
        out = [
            hook({"env_steps": s, "final": f}, SimpleNamespace(params={"w": w}, version=w))
            for s, f, w in rows
        ]
        assert [o["eval_return"] for o in out] == [None, 4.0, None, 8.0, 10.0]
        assert [o["eval_version"] for o in out] == [None, 2, None, 4, 5]
        assert hook({"env_steps": 5_000}, None) == {"eval_return": None, "eval_version": None}


def test_the_score_is_computed_in_another_process():
    with EvaluatorProcess(pid_of_evaluator) as evaluator:
        assert evaluator({"w": 1}) not in (float(os.getpid()), 0.0)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [({"evaluate_params": doubled, "every": 0}, "every=0"),
     ({"evaluate_params": "greedy", "every": 10}, "evaluate_params='greedy'"),
     ({"evaluate_params": lambda p: 0.0, "every": 10}, "cannot be pickled"),
     ({"evaluate_params": doubled, "every": 10, "timeout_s": 0}, "timeout_s=0")],
    ids=["zero-every", "not-callable", "lambda", "zero-timeout"],
)
def test_evaluations_refuse_bad_arguments_before_starting_a_process(kwargs, said):
    with pytest.raises(InvalidArgumentError, match=said):
        Evaluations(**kwargs)


def test_an_evaluation_that_raises_names_the_evaluator_and_the_error():
    with EvaluatorProcess(raises) as evaluator:
        with pytest.raises(ComponentFailedError, match=r"evaluator.*ValueError: no score for w=3"):
            evaluator({"w": 3})
        with pytest.raises(ComponentFailedError, match="ValueError"):  # and it goes on serving
            evaluator({"w": 4})


def test_a_killed_evaluator_is_reported_by_the_next_call():
    with EvaluatorProcess(doubled) as evaluator:
        assert evaluator({"w": 1}) == 2.0
        pid = int(evaluator._proc.pid)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ComponentFailedError, match="killed by signal 9"):
            evaluator({"w": 1})


UNGUARDED_SCRIPT = """
from rlreplay.runtime.evaluator import EvaluatorProcess

def score(params):
    return 1.0

with EvaluatorProcess(score, timeout_s=60) as evaluator:  # no __main__ guard
    evaluator({"w": 1})
"""


def test_an_unguarded_script_is_told_of_the_main_guard(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rlreplay.errors.ComponentFailedError: evaluator failed"), last
    assert 'if __name__ == "__main__":' in last and "module file" in last


def test_an_evaluation_past_its_timeout_raises_and_stops_the_process():
    evaluator = EvaluatorProcess(functools.partial(sleeps, seconds=30.0), timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(ReplayTimeoutError, match=r"timeout_s=0\.5"):
        evaluator({"w": 1})
    assert time.monotonic() - start < 10.0
    with pytest.raises(ComponentFailedError, match="evaluator"):
        evaluator({"w": 1})


def test_close_stops_the_process():
    evaluator = EvaluatorProcess(doubled)
    assert evaluator({"w": 2}) == 4.0
    evaluator.close()
    evaluator.close()  # twice is harmless
    with pytest.raises(ComponentFailedError, match="evaluator"):
        evaluator({"w": 2})
