"""Run Stable-Baselines3's own buffer and off-policy tests against rlreplay's buffers.

Usage::

    python tests/integrations/run_sb3_upstream_tests.py PATH_TO_SB3_TESTS [pytest args]

``PATH_TO_SB3_TESTS`` is the ``tests`` folder of a Stable-Baselines3 checkout (of the
installed version). The chosen test files are copied to a temporary folder beside a
``conftest.py`` that rebinds SB3's ``ReplayBuffer``, ``DictReplayBuffer`` and
``NStepReplayBuffer`` (in ``stable_baselines3.common.buffers`` and in the off-policy
base class, which picks the default buffer) to ``rlreplay.integrations.sb3``'s classes,
and pytest runs there. Nothing of SB3 is kept in this repository.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# file -> the tests that concern replay buffers (None: the whole file)
SELECTION = {
    "test_buffers.py": None,
    "test_n_step_replay.py": None,
    "test_save_load.py": "test_save_load_replay_buffer or test_warn_buffer",
    "test_run.py": (
        "test_deterministic_pg or test_sac or test_n_critics or test_dqn or test_train_freq "
        "or test_offpolicy_multi_env or test_warn_dqn_multi_env"
    ),
    "test_dict_env.py": "SAC or TD3 or DQN or DDPG",
}

CONFTEST = """
import stable_baselines3.common.buffers as buffers
import stable_baselines3.common.off_policy_algorithm as off_policy

import rlreplay.integrations.sb3 as rlreplay_sb3

for _name in ("ReplayBuffer", "DictReplayBuffer", "NStepReplayBuffer"):
    setattr(buffers, _name, getattr(rlreplay_sb3, _name))
    setattr(off_policy, _name, getattr(rlreplay_sb3, _name))
"""


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    source = Path(argv[0])
    with tempfile.TemporaryDirectory(prefix="sb3_upstream_") as folder:
        target = Path(folder)
        (target / "conftest.py").write_text(CONFTEST)
        (target / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
        status = 0
        for name, selection in SELECTION.items():
            shutil.copy(source / name, target / name)
            command = [sys.executable, "-m", "pytest", "-q", "-rfE", name, *argv[1:]]
            if selection:
                command += ["-k", selection]
            print(f"== {name}" + (f" -k {selection!r}" if selection else ""), flush=True)
            status |= subprocess.call(command, cwd=target)
        return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
