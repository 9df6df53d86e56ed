"""SB3's DQN, SAC and TD3 (and the prioritized variants) training on rlreplay's buffers,
a CleanRL-style loop, and save/load_replay_buffer round trips. Tiny networks, few steps."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
import torch as th
from gymnasium import spaces
from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common import buffers as sb3
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize
from torch.nn import functional as F

from rlreplay.integrations.sb3 import (
    DictReplayBuffer,
    NStepReplayBuffer,
    PrioritizedDictReplayBuffer,
    PrioritizedDQN,
    PrioritizedReplayBuffer,
    PrioritizedSAC,
    PrioritizedTD3,
    ReplayBuffer,
)
from rlreplay.integrations.sb3 import algorithms as prioritized_algorithms

STEPS = 200


def small(**kwargs):
    """Tiny settings (a fresh dict each time: SB3 writes into policy_kwargs)."""
    return dict(
        learning_starts=50,
        batch_size=16,
        buffer_size=1_000,
        policy_kwargs=dict(net_arch=[8]),
        seed=0,
        device="cpu",
        **kwargs,
    )


ENV_ID = {
    DQN: "CartPole-v1",
    SAC: "Pendulum-v1",
    TD3: "Pendulum-v1",
    PrioritizedDQN: "CartPole-v1",
    PrioritizedSAC: "Pendulum-v1",
    PrioritizedTD3: "Pendulum-v1",
}


@pytest.fixture(autouse=True)
def one_thread():
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


def params(model) -> list[th.Tensor]:
    return [p.detach().clone() for p in model.policy.parameters()]


def assert_same_params(a, b):
    for x, y in zip(params(a), params(b)):
        assert th.equal(x, y)


@pytest.mark.parametrize("algo", [DQN, SAC, TD3])
@pytest.mark.parametrize("n_envs", [1, 2])
@pytest.mark.parametrize("buffer_class", [ReplayBuffer, NStepReplayBuffer, PrioritizedReplayBuffer])
def test_trains_with_each_class(algo, n_envs, buffer_class):
    env = make_vec_env(ENV_ID[algo], n_envs=n_envs, seed=0)
    model = algo("MlpPolicy", env, replay_buffer_class=buffer_class, **small())
    model.learn(STEPS)
    buffer = model.replay_buffer
    assert type(buffer) is buffer_class
    assert buffer.size() == STEPS // n_envs and buffer.n_envs == n_envs
    assert model.logger.name_to_value["train/n_updates"] > 0


@pytest.mark.parametrize("algo", [DQN, SAC])
def test_same_training_as_sb3_buffer(algo):
    """Same seed, same samples: training on rlreplay's buffer gives SB3's parameters."""
    env = lambda: make_vec_env(ENV_ID[algo], n_envs=2, seed=0)  # noqa: E731
    ours = algo("MlpPolicy", env(), replay_buffer_class=ReplayBuffer, **small()).learn(STEPS)
    ref = algo("MlpPolicy", env(), replay_buffer_class=sb3.ReplayBuffer, **small()).learn(STEPS)
    assert_same_params(ours, ref)


def test_vec_normalize_same_training_as_sb3_buffer():
    def env():
        return VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), gamma=0.99)

    ours = SAC("MlpPolicy", env(), replay_buffer_class=ReplayBuffer, **small()).learn(STEPS)
    ref = SAC("MlpPolicy", env(), replay_buffer_class=sb3.ReplayBuffer, **small()).learn(STEPS)
    assert_same_params(ours, ref)


@pytest.mark.parametrize("algo", [PrioritizedDQN, PrioritizedSAC, PrioritizedTD3])
@pytest.mark.parametrize("n_envs", [1, 2])
def test_prioritized_algorithms_send_td_errors_back(algo, n_envs):
    env = make_vec_env(ENV_ID[algo], n_envs=n_envs, seed=0)
    model = algo("MlpPolicy", env, n_steps=3 if n_envs == 2 else 1, **small())
    model.learn(STEPS)
    buffer = model.replay_buffer
    assert isinstance(buffer, PrioritizedReplayBuffer)
    assert buffer.n_steps == (3 if n_envs == 2 else 1)
    _, priorities = buffer._ring.held_priorities()
    assert len(np.unique(priorities)) > STEPS // 4  # set from TD errors, not the default
    assert buffer.progress == pytest.approx(1.0 - model._current_progress_remaining)


def test_prioritized_dqn_with_uniform_buffer_is_dqn():
    env = lambda: make_vec_env("CartPole-v1", n_envs=1, seed=0)  # noqa: E731
    a = PrioritizedDQN("MlpPolicy", env(), replay_buffer_class=ReplayBuffer, **small()).learn(STEPS)
    b = DQN("MlpPolicy", env(), replay_buffer_class=ReplayBuffer, **small()).learn(STEPS)
    assert_same_params(a, b)


def test_weighted_critic_loss_and_priorities_closed_form():
    buffer = PrioritizedReplayBuffer(
        64, spaces.Box(-1, 1, (2,)), spaces.Discrete(2), "cpu", eps=1e-6
    )
    for i in range(10):
        obs = np.full((1, 2), i, np.float32)
        buffer.add(obs, obs + 1, np.array([0]), np.array([1.0]), np.array([False]), [{}])
    samples = buffer.sample(4)
    batch = prioritized_algorithms._Batch(buffer)
    batch.keys, batch.weights = samples.keys, th.tensor([[1.0], [0.5], [0.25], [1.0]])
    functional = prioritized_algorithms._Functional(F)
    current = th.tensor([[1.0], [2.0], [-1.0], [0.2]], requires_grad=True)
    target = th.tensor([[0.0], [0.0], [1.0], [0.0]])
    prioritized_algorithms._active.batch = batch
    try:
        loss = functional.smooth_l1_loss(current, target)
        assert functional.relu is F.relu  # everything else is torch's
    finally:
        prioritized_algorithms._active.batch = None
    huber = F.smooth_l1_loss(current, target, reduction="none")
    assert th.allclose(loss, (huber * batch.weights).mean())
    # Outside a prioritized train() the loss is torch's own.
    assert th.equal(functional.smooth_l1_loss(current, target), F.smooth_l1_loss(current, target))
    batch.flush()
    keys = samples.keys
    index = buffer.table.index
    slots = keys & 0xFFFFFFFF
    expected = {
        int(s): abs(float(c - t)) + 1e-6
        for s, c, t in zip(slots, current.detach().ravel(), target.ravel())
    }  # last duplicate wins
    for slot, value in expected.items():
        assert index.priority[slot] == pytest.approx(value)


class DictObs(gym.ObservationWrapper):
    """Pendulum (or CartPole) with its observation split into a dict of two parts."""

    def __init__(self, env):
        super().__init__(env)
        box = env.observation_space
        self.observation_space = spaces.Dict(
            {
                "head": spaces.Box(box.low[:2], box.high[:2], dtype=np.float32),
                "tail": spaces.Box(box.low[2:], box.high[2:], dtype=np.float32),
            }
        )

    def observation(self, observation):
        return {"head": observation[:2], "tail": observation[2:]}


@pytest.mark.parametrize(
    "algo, buffer_class",
    [
        (SAC, DictReplayBuffer),
        (DQN, PrioritizedDictReplayBuffer),
        (PrioritizedSAC, None),
    ],
)
def test_dict_observations(algo, buffer_class):
    env = make_vec_env(ENV_ID[algo], n_envs=2, seed=0, wrapper_class=DictObs)
    kwargs = small() if buffer_class is None else small(replay_buffer_class=buffer_class)
    model = algo("MultiInputPolicy", env, **kwargs).learn(STEPS)
    assert isinstance(model.replay_buffer, DictReplayBuffer)
    if algo is SAC:  # the same as SB3's DictReplayBuffer
        ref = SAC(
            "MultiInputPolicy",
            make_vec_env(ENV_ID[algo], n_envs=2, seed=0, wrapper_class=DictObs),
            replay_buffer_class=sb3.DictReplayBuffer,
            **small(),
        ).learn(STEPS)
        assert_same_params(model, ref)


@pytest.mark.parametrize(
    "algo, buffer_class",
    [
        (DQN, ReplayBuffer),
        (SAC, NStepReplayBuffer),
        (PrioritizedTD3, None),
    ],
)
def test_save_load_replay_buffer_round_trip(tmp_path, algo, buffer_class):
    kwargs = small() if buffer_class is None else small(replay_buffer_class=buffer_class)
    env = make_vec_env(ENV_ID[algo], n_envs=2, seed=0)
    model = algo("MlpPolicy", env, **kwargs).learn(120)
    old = model.replay_buffer
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    fresh = algo("MlpPolicy", env, **kwargs)
    fresh.load_replay_buffer(tmp_path / "buffer.pkl")
    new = fresh.replay_buffer
    assert type(new) is type(old) and (new.pos, new.full, new.size()) == (
        old.pos,
        old.full,
        old.size(),
    )
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
        np.testing.assert_array_equal(getattr(old, name), getattr(new, name))
    if hasattr(old, "update_priorities"):
        np.testing.assert_array_equal(
            old._ring.held_priorities()[1], new._ring.held_priorities()[1]
        )
    else:
        np.random.seed(4)
        a = old.sample(32)
        np.random.seed(4)
        b = new.sample(32)
        for x, y in zip(a, b):
            assert (x is None and y is None) or th.equal(x, y)
    fresh.learn(60, reset_num_timesteps=False)  # and training goes on
    assert new.size() >= 90  # 60 more steps (SB3 collects whole train_freq rounds)


def test_cleanrl_style_loop():
    """A loop written as CleanRL's dqn.py writes it: gymnasium vector env, the buffer
    built with handle_timeout_termination=False, final observations of truncated
    episodes passed as next_obs."""
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=30) for _ in range(2)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    device = th.device("cpu")
    rb = ReplayBuffer(
        500,
        envs.single_observation_space,
        envs.single_action_space,
        device,
        handle_timeout_termination=False,
        n_envs=2,
    )
    ref = sb3.ReplayBuffer(
        500,
        envs.single_observation_space,
        envs.single_action_space,
        device,
        handle_timeout_termination=False,
        n_envs=2,
    )
    q_network = th.nn.Linear(4, 2)
    optimizer = th.optim.Adam(q_network.parameters(), lr=1e-3)
    obs, _ = envs.reset(seed=0)
    for global_step in range(300):
        actions = envs.action_space.sample()
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        real_next_obs = next_obs.copy()
        for idx, ended in enumerate(np.logical_or(terminations, truncations)):
            if ended:
                real_next_obs[idx] = infos["final_obs"][idx]
        rb.add(obs, real_next_obs, actions, rewards, terminations, infos)
        ref.add(obs, real_next_obs, actions, rewards, terminations, infos)
        obs = next_obs
        if global_step > 50:
            data = rb.sample(32)
            with th.no_grad():
                target_max, _ = q_network(data.next_observations).max(dim=1)
                td_target = data.rewards.flatten() + 0.99 * target_max * (1 - data.dones.flatten())
            old_val = q_network(data.observations).gather(1, data.actions).squeeze()
            loss = F.mse_loss(td_target, old_val)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    np.testing.assert_array_equal(rb.observations, ref.observations)
    np.testing.assert_array_equal(rb.next_observations, ref.next_observations)
    np.testing.assert_array_equal(rb.dones, ref.dones.astype(bool))
    assert np.count_nonzero(rb._ring.final_at) > 0  # episodes ended: final observations kept


def test_cleanrl_runner_resolves_both_buffer_imports(tmp_path):
    """`python -m rlreplay.integrations.sb3.cleanrl script.py ...` runs an unedited
    script whose `cleanrl_utils.buffers` and SB3 `ReplayBuffer` are rlreplay's."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        "from cleanrl_utils.buffers import ReplayBuffer as A\n"
        "from stable_baselines3.common.buffers import ReplayBuffer as B, DictReplayBuffer\n"
        "from gymnasium import spaces\n"
        "import stable_baselines3.common.buffers as sb3\n"
        "space = spaces.Dict({'x': spaces.Box(0, 1, (2,))})\n"
        "DictReplayBuffer(4, space, spaces.Discrete(2))  # SB3's own classes unchanged\n"
        "assert sb3.ReplayBuffer.__module__ == 'stable_baselines3.common.buffers'\n"
        "print(A.__module__, B.__name__, B.__module__, sys.argv[1:])\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlreplay.integrations.sb3.cleanrl",
            "--prioritized",
            str(script),
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "rlreplay.integrations.sb3.buffers",
        "PrioritizedReplayBuffer",
        "rlreplay.integrations.sb3.buffers",
        "['--seed',",
        "'3']",
    ]


def test_cleanrl_runner_finds_the_modules_beside_the_script(tmp_path):
    """As `python script.py`, the script's folder comes first on the path."""
    import subprocess
    import sys

    (tmp_path / "helper_module.py").write_text("X = 42\n")
    script = tmp_path / "script.py"
    script.write_text("from helper_module import X\nprint(X)\n")
    out = subprocess.run(
        [sys.executable, "-m", "rlreplay.integrations.sb3.cleanrl", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["42"]


def test_run_script_restores_argv_and_path_and_changes_nothing_for_a_missing_script(tmp_path):
    import sys

    from rlreplay.integrations.sb3.cleanrl import run_script

    script = tmp_path / "script.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['--seed', '3']\n")
    argv, path = list(sys.argv), list(sys.path)
    run_script(str(script), ["--seed", "3"])
    assert (sys.argv, sys.path) == (argv, path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_script(str(tmp_path / "nope.py"), ["--x"])
    assert (sys.argv, sys.path) == (argv, path)


def test_cleanrl_runner_shows_its_help_and_names_a_missing_script(tmp_path, capsys):
    from rlreplay.integrations.sb3.cleanrl import main

    main(["--help"])  # returns: exit status 0
    assert "python -m rlreplay.integrations.sb3.cleanrl" in capsys.readouterr().out
    missing = str(tmp_path / "dqn.py")
    with pytest.raises(SystemExit, match="does not exist") as exit_:
        main([missing, "--seed", "1"])
    assert missing in str(exit_.value)
