"""Stable-Baselines3 with rlreplay's buffers against SB3's own: speed, memory, learning.

``speed``: SB3's ``DQN`` on CartPole-v1 and ``SAC`` on Pendulum-v1 (default settings,
``--steps`` env steps, one env), once with SB3's ``ReplayBuffer`` and once with
``rlreplay.integrations.sb3.ReplayBuffer``, in the same process, same seed (the runs are
the same training: the buffers return the same batches). Reports total wall time, the
time per ``sample()`` and ``add()`` call (each call timed where SB3 makes it) and the
buffer's bytes per transition slot.

``learning``: ``PrioritizedDQN`` with 3-step returns against SB3's ``DQN``, both with
the rl-zoo's CartPole-v1 settings, over ``--seeds`` seeds: env steps to a mean
evaluation return of 475 (10 deterministic episodes every ``--eval-every`` steps); and
``PrioritizedSAC`` against ``SAC`` on Pendulum-v1 (zoo settings: learning rate 1e-3):
steps to a mean evaluation of -200.

``train``: SB3's ``train()`` alone, ``--gradient-steps`` steps from the same weights on
buffers holding the same 20k transitions, SB3's and rlreplay's alternating in
``--rounds`` rounds (median reported): the training step's time with each buffer,
``sample()`` included, without the drift of a long run.

``calls``: ``sample()`` and ``add()`` alone on buffers holding the same 20k transitions,
SB3's and rlreplay's alternating in rounds, the median round reported; and ``sample()``
right after a gradient step of SB3's default network (64-64, Adam), as inside training,
where the code the step ran has pushed numpy's out of the CPU's caches: the median call,
with ``np.random.randint`` (which both buffers call) timed the same way.

Run: ``python -m benchmarks.bench_sb3 speed [--steps 20000]``, ``... calls``, ``... train``
or ``python -m benchmarks.bench_sb3 learning [--seeds 5] [--agents dqn sac]``. Prints a
table and writes ``benchmarks/results/sb3_<part>[_<agents>].json``
(and ``docs/sb3_learning_*.png`` curves when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# rl-zoo hyperparameters (rl-baselines3-zoo, hyperparams/dqn.yml and sac.yml)
ZOO_DQN_CARTPOLE = dict(
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=1000,
    gamma=0.99,
    target_update_interval=10,
    train_freq=256,
    gradient_steps=128,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
    policy_kwargs=dict(net_arch=[256, 256]),
)
ZOO_SAC_PENDULUM = dict(learning_rate=1e-3)


class Timed:
    """Wraps a bound method and adds up the time its calls take."""

    def __init__(self, method):
        self.method, self.calls, self.seconds = method, 0, 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.method(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    @property
    def us_per_call(self) -> float:
        return 1e6 * self.seconds / max(self.calls, 1)


def bytes_per_transition(buffer) -> float:
    slots = buffer.buffer_size * buffer.n_envs
    if hasattr(buffer, "nbytes"):  # rlreplay's: store, final observations, small arrays
        return buffer.nbytes() / slots
    arrays = [buffer.observations, buffer.actions, buffer.rewards, buffer.dones, buffer.timeouts]
    if not buffer.optimize_memory_usage:
        arrays.append(buffer.next_observations)
    return sum(a.nbytes for a in arrays) / slots


def speed_run(algo_name: str, buffer_name: str, steps: int, seed: int) -> dict:
    import torch as th
    from stable_baselines3 import DQN, SAC
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    from rlreplay.integrations.sb3 import ReplayBuffer

    th.set_num_threads(1)
    algo, env_id = {"dqn": (DQN, "CartPole-v1"), "sac": (SAC, "Pendulum-v1")}[algo_name]
    buffer_class = {"sb3": SB3ReplayBuffer, "rlreplay": ReplayBuffer}[buffer_name]
    start = time.perf_counter()
    model = algo("MlpPolicy", env_id, replay_buffer_class=buffer_class, seed=seed, device="cpu")
    buffer = model.replay_buffer
    buffer.sample, buffer.add = Timed(buffer.sample), Timed(buffer.add)
    model.learn(steps)
    wall = time.perf_counter() - start
    return {
        "algo": algo_name,
        "env": env_id,
        "buffer": buffer_name,
        "steps": steps,
        "wall_s": round(wall, 2),
        "sample_us": round(buffer.sample.us_per_call, 2),
        "sample_calls": buffer.sample.calls,
        "add_us": round(buffer.add.us_per_call, 2),
        "bytes_per_transition": round(bytes_per_transition(buffer), 2),
        "batch_size": model.batch_size,
    }


def speed(args) -> list[dict]:
    rows = []
    for algo in args.agents:
        # alternate the order over repeats, so neither always runs first
        for repeat in range(args.repeats):
            order = ("sb3", "rlreplay") if repeat % 2 == 0 else ("rlreplay", "sb3")
            for buffer in order:
                row = speed_run(algo, buffer, args.steps, seed=repeat)
                print(json.dumps(row), flush=True)
                rows.append(row)
    print()
    print("| algorithm | buffer | wall s | sample() us | add() us | bytes/transition |")
    print("|---|---|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['algo']} {row['env']} ({row['steps']} steps, batch {row['batch_size']}) "
            f"| {row['buffer']} | {row['wall_s']} | {row['sample_us']} | {row['add_us']} | "
            f"{row['bytes_per_transition']} |"
        )
    return rows


def calls(args) -> list[dict]:
    """``sample()`` and ``add()`` alone, on buffers holding the same 20k transitions of
    CartPole's and Pendulum's shapes, SB3's and rlreplay's alternating in rounds (the
    median round reported: robust to a shared machine's load). ``add()`` gets arrays of
    the dtypes SB3's ``VecEnv`` hands its buffers (float32 rewards, bool dones)."""
    import gymnasium as gym
    import torch as th
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    from rlreplay.integrations.sb3 import ReplayBuffer

    th.set_num_threads(1)
    cases = [("CartPole-v1", 32), ("CartPole-v1", 64), ("Pendulum-v1", 256)]
    rows = []
    for env_id, batch in cases:
        env = gym.make(env_id)
        steps = _recorded_steps(env)
        update = _gradient_step(env)
        times: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for name, cls in (("sb3", SB3ReplayBuffer), ("rlreplay", ReplayBuffer)):
                buffer = cls(1_000_000, env.observation_space, env.action_space, "cpu")
                start = time.perf_counter()
                for step in steps:
                    buffer.add(*step)
                add_us = 1e6 * (time.perf_counter() - start) / len(steps)
                start = time.perf_counter()
                for _ in range(2_000):
                    buffer.sample(batch)
                sample_us = 1e6 * (time.perf_counter() - start) / 2_000
                entry = times.setdefault(name, {"add": [], "sample": [], "after": []})
                entry["add"].append(add_us)
                entry["sample"].append(sample_us)
                entry["after"].append(
                    _after_update(update, functools.partial(buffer.sample, batch))
                )
            randint = times.setdefault("randint", {"sample": [], "after": []})
            draw = functools.partial(np.random.randint, 0, 20_000, size=batch)
            randint["sample"].append(_after_update(None, draw))
            randint["after"].append(_after_update(update, draw))
        for name in ("sb3", "rlreplay", "randint"):
            entry = times[name]
            rows.append(
                {
                    "env": env_id,
                    "batch_size": batch,
                    "buffer": name,
                    "add_us": round(float(np.median(entry["add"])), 2) if "add" in entry else None,
                    "sample_us": round(float(np.median(entry["sample"])), 2),
                    "sample_after_update_us": round(float(np.median(entry["after"])), 2),
                    "rounds": args.rounds,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print()
    print(
        "| observations, batch | SB3 sample() us | rlreplay sample() us | speed-up "
        "| after an update: SB3 | rlreplay | speed-up | randint alone | after an update "
        "| SB3 add() us | rlreplay add() us |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sb3_row, ours, draw in zip(rows[::3], rows[1::3], rows[2::3]):
        print(
            f"| {sb3_row['env']}, {sb3_row['batch_size']} | {sb3_row['sample_us']} | "
            f"{ours['sample_us']} | {sb3_row['sample_us'] / ours['sample_us']:.2f}x | "
            f"{sb3_row['sample_after_update_us']} | {ours['sample_after_update_us']} | "
            f"{sb3_row['sample_after_update_us'] / ours['sample_after_update_us']:.2f}x | "
            f"{draw['sample_us']} | {draw['sample_after_update_us']} | "
            f"{sb3_row['add_us']} | {ours['add_us']} |"
        )
    return rows


def _recorded_steps(env, steps: int = 20_000) -> list[tuple]:
    """``steps`` random-action transitions of ``env`` (seed 0) as ``add()``'s arguments for
    one env, in the dtypes SB3's ``VecEnv`` hands its buffers (float32 rewards)."""
    obs, _ = env.reset(seed=0)
    recorded = []
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        recorded.append(
            (
                obs[None],
                next_obs[None],
                np.array([action]),
                np.array([reward], dtype=np.float32),
                np.array([terminated or truncated]),
                [{"TimeLimit.truncated": truncated}],
            )
        )
        obs = env.reset()[0] if terminated or truncated else next_obs
    return recorded


def train(args) -> list[dict]:
    """SB3's ``train()`` alone (``--gradient-steps`` steps, ``sample()`` included), with
    SB3's buffer and rlreplay's holding the same 20k transitions, from the same weights,
    alternating in ``--rounds`` rounds: what the buffers change in a training step, without
    the environment's and ``add()``'s time or the drift of a long run."""
    import copy

    import gymnasium as gym
    import torch as th
    from stable_baselines3 import DQN, SAC
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
    from stable_baselines3.common.logger import configure

    from rlreplay.integrations.sb3 import ReplayBuffer

    th.set_num_threads(1)
    rows = []
    for algo_name in args.agents:
        algo, env_id = {"dqn": (DQN, "CartPole-v1"), "sac": (SAC, "Pendulum-v1")}[algo_name]
        env = gym.make(env_id)
        steps = _recorded_steps(env)
        buffers = {}
        for name, cls in (("sb3", SB3ReplayBuffer), ("rlreplay", ReplayBuffer)):
            buffer = cls(1_000_000, env.observation_space, env.action_space, "cpu")
            for step in steps:
                buffer.add(*step)
            buffers[name] = buffer
        model = algo("MlpPolicy", env_id, device="cpu", seed=0)
        model.set_logger(configure(None, []))
        weights = copy.deepcopy(model.policy.state_dict())
        seconds: dict[str, list[float]] = {name: [] for name in buffers}
        for round_ in range(args.rounds):
            for name in list(buffers) if round_ % 2 == 0 else list(buffers)[::-1]:
                model.policy.load_state_dict(weights)
                model.replay_buffer = buffers[name]
                np.random.seed(round_)
                start = time.perf_counter()
                model.train(gradient_steps=args.gradient_steps, batch_size=model.batch_size)
                seconds[name].append(time.perf_counter() - start)
        for name, times in seconds.items():
            rows.append(
                {
                    "algo": algo_name,
                    "env": env_id,
                    "buffer": name,
                    "gradient_steps": args.gradient_steps,
                    "batch_size": model.batch_size,
                    "train_s_median": round(float(np.median(times)), 3),
                    "train_s": [round(t, 3) for t in times],
                    "rounds": args.rounds,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print()
    print("| algorithm | train() s, SB3's buffer | rlreplay's | ratio |")
    print("|---|---:|---:|---:|")
    for sb3_row, ours in zip(rows[::2], rows[1::2]):
        print(
            f"| {sb3_row['algo']} {sb3_row['env']} ({sb3_row['gradient_steps']} steps, batch "
            f"{sb3_row['batch_size']}) | {sb3_row['train_s_median']} | "
            f"{ours['train_s_median']} | "
            f"{sb3_row['train_s_median'] / ours['train_s_median']:.2f}x |"
        )
    return rows


def _gradient_step(env):
    """One Adam step of SB3's default MLP (64-64) on a batch of 32 random inputs, as a
    function: what runs between two ``sample()`` calls inside training."""
    import torch as th

    n_in = int(np.prod(env.observation_space.shape))
    net = th.nn.Sequential(
        th.nn.Linear(n_in, 64),
        th.nn.ReLU(),
        th.nn.Linear(64, 64),
        th.nn.ReLU(),
        th.nn.Linear(64, 2),
    )
    optimizer = th.optim.Adam(net.parameters())

    def step() -> None:
        loss = net(th.randn(32, n_in)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def _after_update(update, call, n: int = 1_000) -> float:
    """The median time of ``call`` (us), each call right after ``update()`` (``None``:
    after the previous call)."""
    times = []
    for _ in range(n):
        if update is not None:
            update()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e6 * float(np.median(times))


def evaluate(model, env, episodes: int) -> float:
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=10_000 + episode)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def learning_run(
    agent: str,
    variant: str,
    seed: int,
    steps: int,
    eval_every: int,
    target: float,
    stop_at_target: bool = False,
) -> dict:
    import gymnasium as gym
    import torch as th
    from stable_baselines3 import DQN, SAC
    from stable_baselines3.common.callbacks import BaseCallback

    from rlreplay.integrations.sb3 import PrioritizedDQN, PrioritizedSAC

    th.set_num_threads(1)
    if agent == "dqn":
        env_id, kwargs = "CartPole-v1", dict(ZOO_DQN_CARTPOLE)
        algo = DQN if variant == "sb3" else PrioritizedDQN
        if variant == "prioritized":
            kwargs["n_steps"] = 3
    else:
        env_id, kwargs = "Pendulum-v1", dict(ZOO_SAC_PENDULUM)
        algo = SAC if variant == "sb3" else PrioritizedSAC
    eval_env = gym.make(env_id)
    curve: list[tuple[int, float]] = []

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every == 0:
                curve.append((self.num_timesteps, evaluate(self.model, eval_env, 10)))
                if stop_at_target and curve[-1][1] >= target:
                    return False  # steps to target known: the rest is not measured
            return True

    start = time.perf_counter()
    model = algo("MlpPolicy", env_id, seed=seed, device="cpu", **kwargs)
    model.learn(steps, callback=Evaluate())
    reached = next((t for t, r in curve if r >= target), None)
    return {
        "agent": agent,
        "variant": variant,
        "seed": seed,
        "target": target,
        "steps_to_target": reached,
        "final_eval": curve[-1][1] if curve else None,
        "curve": curve,
        "wall_s": round(time.perf_counter() - start, 1),
    }


def learning(args) -> list[dict]:
    settings = {"dqn": (50_000, 475.0), "sac": (args.sac_steps, -200.0)}
    rows = []
    for agent in args.agents:
        steps, target = settings[agent]
        seeds = args.seeds if agent == "dqn" else args.sac_seeds
        for seed in range(seeds):
            for variant in ("sb3", "prioritized"):
                row = learning_run(
                    agent, variant, seed, steps, args.eval_every[agent], target, args.stop_at_target
                )
                print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
                rows.append(row)
    print()
    print("| agent | variant | target | seeds reaching it | steps to target | last eval@step |")
    print("|---|---|---|---:|---|---|")
    for agent in args.agents:
        for variant in ("sb3", "prioritized"):
            runs = [r for r in rows if r["agent"] == agent and r["variant"] == variant]
            hit = [r["steps_to_target"] for r in runs if r["steps_to_target"] is not None]
            finals = ", ".join(
                f"{r['final_eval']:.0f}@{r['curve'][-1][0]}" for r in runs if r["curve"]
            )
            spread = f"{min(hit)}-{max(hit)} (median {int(np.median(hit))})" if hit else "-"
            print(
                f"| {agent} | {variant} | {runs[0]['target']} | {len(hit)} / {len(runs)} "
                f"| {spread} | {finals} |"
            )
    plot(rows)
    return rows


def plot(rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for agent in {r["agent"] for r in rows}:
        fig, ax = plt.subplots(figsize=(6, 4))
        for row in (r for r in rows if r["agent"] == agent):
            steps, values = zip(*row["curve"]) if row["curve"] else ((), ())
            color = "tab:blue" if row["variant"] == "sb3" else "tab:orange"
            ax.plot(
                steps,
                values,
                color=color,
                alpha=0.7,
                label=row["variant"] if row["seed"] == 0 else None,
            )
        ax.axhline({"dqn": 475.0, "sac": -200.0}[agent], color="gray", ls=":")
        ax.set_xlabel("env steps")
        ax.set_ylabel("mean evaluation return (10 episodes)")
        ax.set_title(
            {
                "dqn": "CartPole-v1: DQN vs PrioritizedDQN (3-step)",
                "sac": "Pendulum-v1: SAC vs PrioritizedSAC",
            }[agent]
        )
        ax.legend()
        fig.tight_layout()
        fig.savefig(ROOT / "docs" / f"sb3_learning_{agent}.png", dpi=80)
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["speed", "calls", "train", "learning"])
    parser.add_argument("--rounds", type=int, default=5, help="calls: alternating rounds")
    parser.add_argument("--agents", nargs="+", choices=["dqn", "sac"], default=["dqn", "sac"])
    parser.add_argument("--steps", type=int, default=20_000, help="speed: env steps per run")
    parser.add_argument("--repeats", type=int, default=1, help="speed: runs per buffer")
    parser.add_argument(
        "--gradient-steps", type=int, default=600, help="train: steps per timed call"
    )
    parser.add_argument("--seeds", type=int, default=5, help="learning: DQN seeds")
    parser.add_argument("--sac-seeds", type=int, default=2, help="learning: SAC seeds")
    parser.add_argument("--sac-steps", type=int, default=10_000, help="learning: SAC steps")
    parser.add_argument(
        "--stop-at-target",
        action="store_true",
        help="learning: end a run at its first evaluation at the target",
    )
    args = parser.parse_args()
    args.eval_every = {"dqn": 2_500, "sac": 1_000}
    rows = {"speed": speed, "calls": calls, "train": train, "learning": learning}[args.part](
        args
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = args.part if args.part == "calls" else "_".join([args.part, *args.agents])
    out = RESULTS / f"sb3_{name}.json"
    out.write_text(json.dumps(rows, indent=1))
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
