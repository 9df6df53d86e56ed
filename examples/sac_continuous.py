"""Soft Actor-Critic on a continuous-action gymnasium task, acting and learning through
rlreplay's runtime (Pendulum-v1 unless ``--env-id`` names another, e.g. a MuJoCo task).

One readable file in the CleanRL style: twin Q networks with target copies updated by
Polyak averaging, a tanh-squashed Gaussian actor, and the entropy temperature tuned
automatically towards ``-action_dim``. Acting and learning meet only through a uniform
replay table of one-step transitions; the ratio of gradient updates to env steps
(``updates_per_env_step``, 1 here as in the SAC paper) is held by the table's rate
limiter, not by this file's control flow.

Who owns what:

* the actor (built by the runtime, in a thread or a process) holds a :class:`SacPolicy`:
  the actor network in numpy, so acting needs no torch, fed new weights every
  ``weight_sync_period`` env steps; before ``learning_starts`` env steps it acts
  uniformly at random, as CleanRL's SAC does;
* the learner (:class:`SacLearner`, in the driver) holds the torch networks and their
  optimizers; :meth:`SacLearner.update` is one gradient step on one sampled batch;
* an evaluator process scores the newest weights every ``eval_every`` env steps with the
  mean (deterministic) action (:func:`mean_action_return`); the driver writes
  ``metrics.csv``, ``summary.json`` and ``learning_curve.png`` to ``--out``.

Run it::

    python examples/sac_continuous.py --seed 0 --total-steps 20000 --out runs/sac_continuous

The observation and action sizes and the action bounds are read from the env's spaces
(a ``Box`` of observations, a bounded ``Box`` of actions), so the same file trains on a
MuJoCo task (``--env-id Hopper-v5``, with ``gymnasium[mujoco]``).

The default backend is ``threads``: Pendulum's steps are cheap (acting is about 1% of the
work), and an actor thread beside the learner costs less than a process and the server it
writes through (measured in ``docs/async_vs_sync.md``). It is as fast as a process where
the env's steps cost as much as the learner's in C code that releases the interpreter lock
(a simulator such as MuJoCo: both 1.58x ``inline`` there). Where they cost as much in Python,
which holds the lock, ``--backend processes`` runs the actor in its own process, on
another core; ``--backend inline`` alternates them in one thread (exactly reproducible).

The summary adds to the common keys (see :mod:`rlreplay.runtime.report`) how the learner
spent its time: ``update_ms_mean`` (one gradient step), ``learner_wait_frac`` (the
runtime's fraction of learner time spent waiting for a batch) and
``learner_outside_update_frac`` (the fraction of the learner's time between its first and
last update spent outside ``update``: getting batches from replay and publishing weights).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import rlreplay
import rlreplay.runtime as rt
from rlreplay.errors import InvalidArgumentError
from rlreplay.runtime import report
from rlreplay.runtime.flags import check_ranges, parse_flags, run_script

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass(frozen=True, eq=False)
class Spaces:
    """What the networks and the policy need to know of an env's spaces."""

    obs_dim: int
    action_low: np.ndarray
    """float32 [action_dim]: the action space's lower bounds"""
    action_high: np.ndarray
    """float32 [action_dim]: its upper bounds"""

    def __post_init__(self) -> None:  # float32, as the networks' weights and the table's
        for name in ("action_low", "action_high"):
            value = np.asarray(getattr(self, name), dtype=np.float32).reshape(-1)
            object.__setattr__(self, name, value)

    @property
    def action_dim(self) -> int:
        return len(self.action_low)

    @property
    def action_scale(self) -> np.ndarray:
        """Half the width of each action's range (tanh's [-1, 1] is scaled by it)."""
        return (self.action_high - self.action_low) / 2

    @property
    def action_bias(self) -> np.ndarray:
        """The middle of each action's range."""
        return (self.action_high + self.action_low) / 2

    def squash(self, u: np.ndarray) -> np.ndarray:
        """Actions in the env's bounds for pre-squash values ``u`` [B, action_dim] (clipped:
        float32 rounding of scale and bias may land one ulp outside)."""
        actions = np.tanh(u) * self.action_scale + self.action_bias
        return np.clip(actions, self.action_low, self.action_high).astype(np.float32)

    @classmethod
    def of(cls, env_id: str) -> Spaces:
        """The spaces of ``gymnasium.make(env_id)``.

        Raises:
            InvalidArgumentError: when the env's observations are not a flat ``Box`` or its
                actions not a bounded ``Box``.
        """
        import gymnasium as gym

        env = gym.make(env_id)
        try:
            obs_space, action_space = env.observation_space, env.action_space
        finally:
            env.close()
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise InvalidArgumentError(
                f"--env-id={env_id!r} has observations {obs_space}; this SAC takes a flat Box "
                "(wrap the env with gymnasium.wrappers.FlattenObservation)"
            )
        bounded = isinstance(action_space, gym.spaces.Box) and action_space.is_bounded()
        if not bounded or len(action_space.shape) != 1:
            raise InvalidArgumentError(
                f"--env-id={env_id!r} has actions {action_space}; this SAC takes a flat Box "
                "with finite bounds (a discrete-action task needs DQN: dqn_cartpole.py)"
            )
        return cls(int(obs_space.shape[0]), action_space.low, action_space.high)


@dataclass
class Args:
    """Command-line flags (``--total-steps`` for ``total_steps`` and so on)."""

    seed: int = 0
    """seed of the env, the policy's random generator, torch and the replay table"""
    env_id: str = "Pendulum-v1"
    """gymnasium id of the task: flat Box observations, bounded Box actions"""
    target_return: float = -200.0
    """evaluation return counted as reaching the task (Pendulum-v1's; set it for others)"""
    total_steps: int = 20_000
    """env steps to take, summed over the vector env's envs"""
    backend: str = "threads"
    """runtime backend: threads (the fastest here for cheap envs, as fast as processes for
    costly ones in C that release the interpreter lock), processes (the actor's env loop
    and the learner's torch steps on two cores, not sharing one interpreter lock, for envs
    costly in Python; needs the net extra) or inline"""
    out: str = "runs/sac_continuous"
    """folder for metrics.csv, summary.json and learning_curve.png ('' writes nothing)"""
    num_envs: int = 1
    """envs in the actor's vector env (one batched policy call steps them all)"""
    buffer_size: int = 100_000
    """most transitions the replay table holds"""
    batch_size: int = 256
    """transitions per gradient step"""
    updates_per_env_step: float = 1.0
    """gradient steps per env step, held by the table's rate limiter"""
    learning_starts: int = 1_000
    """env steps of uniform random actions; also the table size before the first sample"""
    gamma: float = 0.99
    """discount"""
    tau: float = 0.005
    """Polyak step of the target networks after every update"""
    hidden: int = 128
    """units in each of the two hidden layers of every network"""
    policy_lr: float = 1e-3
    """actor learning rate (Adam)"""
    q_lr: float = 1e-3
    """Q networks' learning rate (Adam)"""
    alpha_lr: float = 1e-3
    """entropy temperature learning rate (Adam on log alpha)"""
    weight_sync_period: int = 20
    """env steps between the actor's pulls of new weights"""
    publish_every: int = 10
    """learner updates between weight publications"""
    eval_every: int = 1_000
    """env steps between evaluations"""
    eval_episodes: int = 20
    """episodes per evaluation (mean action, no exploration)"""
    progress: bool = True
    """show the runtime's progress bar (--no-progress: none)"""

    def __post_init__(self) -> None:
        """Check the values the runtime does not check itself.

        Raises:
            InvalidArgumentError: naming the flag, its value and the range it must be in.
        """
        check_ranges(
            self,
            counts=("total_steps", "num_envs", "buffer_size", "hidden", "eval_every",
                    "eval_episodes", "batch_size", "weight_sync_period", "publish_every",
                    "learning_starts"),
            non_negative=("seed",),
            positive=("policy_lr", "q_lr", "alpha_lr", "updates_per_env_step"),
            fractions=("gamma",),
            open_fractions=("tau",),
            at_most=(("batch_size", "buffer_size"), ("learning_starts", "buffer_size")),
        )


# ------------------------------------------------------------------ environments
def make_env(seed: int, env_id: str = "Pendulum-v1", num_envs: int = 1) -> Any:
    """The actor's vector env (the runtime resets it with ``seed``)."""
    import gymnasium as gym

    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")


def make_eval_env(seed: int, env_id: str = "Pendulum-v1") -> Any:
    """One env for evaluation (:func:`rlreplay.runtime.report.evaluate` seeds its resets)."""
    import gymnasium as gym

    return gym.make(env_id)


# ------------------------------------------------------------------ acting (numpy)
def actor_forward(params: dict[str, np.ndarray], obs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Mean and log std of the pre-squash Gaussian for ``obs`` [B, obs_dim], in numpy.

    The same computation as :meth:`Actor.forward` on the same weights (a test checks it).
    """
    h = np.maximum(obs @ params["trunk.0.weight"].T + params["trunk.0.bias"], 0.0)
    h = np.maximum(h @ params["trunk.2.weight"].T + params["trunk.2.bias"], 0.0)
    mean = h @ params["mean.weight"].T + params["mean.bias"]
    log_std = np.tanh(h @ params["log_std.weight"].T + params["log_std.bias"])
    log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1.0)
    return mean, log_std


def greedy_action(params: dict[str, np.ndarray], obs: np.ndarray, spaces: Spaces) -> np.ndarray:
    """The deterministic action (squashed mean) for ``obs`` [B, obs_dim]."""
    mean, _ = actor_forward(params, np.asarray(obs, dtype=np.float32))
    return spaces.squash(mean)


def mean_action_return(
    params: dict[str, np.ndarray], episodes: int, env_id: str, spaces: Spaces
) -> float:
    """Mean return of the deterministic (mean) action of ``params`` over ``episodes``
    episodes of ``env_id`` (run in the evaluator's process, see
    :class:`rlreplay.runtime.report.Evaluations`)."""
    return report.evaluate(
        functools.partial(make_eval_env, env_id=env_id),
        lambda obs: greedy_action(params, obs[None], spaces)[0],
        episodes=episodes,
    )


class SacPolicy:
    """The actor's policy: squashed Gaussian samples from the newest weights it was given.

    Acts uniformly at random for its first ``random_steps`` env steps (and until it has
    weights), then samples ``tanh(mean + std * noise)`` scaled to the action bounds.

    Args:
        actor_index: this actor's index (unused: one exploration scheme for all).
        num_actors: actors in the run (unused).
        seed: seeds this policy's random generator.
        spaces: the env's observation size and action bounds.
        random_steps: env steps of uniform random actions at the start.
    """

    def __init__(
        self, actor_index: int, num_actors: int, seed: int, spaces: Spaces, random_steps: int = 0
    ):
        self.rng = np.random.default_rng(seed)
        self.spaces = spaces
        self.random_steps = random_steps
        self.params: dict[str, np.ndarray] | None = None

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        """Act with ``params`` (numpy arrays named as in :class:`Actor`) from now on."""
        self.params = params

    def __call__(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        """Actions [num_envs, action_dim] (float32) for ``obs`` [num_envs, obs_dim]."""
        spaces = self.spaces
        if self.params is None or env_steps < self.random_steps:
            shape = (len(obs), spaces.action_dim)
            return self.rng.uniform(spaces.action_low, spaces.action_high, shape).astype(np.float32)
        mean, log_std = actor_forward(self.params, np.asarray(obs, dtype=np.float32))
        noise = self.rng.standard_normal(mean.shape)
        return spaces.squash(mean + np.exp(log_std) * noise)


# ------------------------------------------------------------------ learning (torch)
def build_networks(hidden: int, spaces: Spaces) -> tuple[Any, Any]:
    """The actor and twin-Q module classes (torch is imported here, in the learner only)."""
    import torch
    from torch import nn

    obs_dim, action_dim = spaces.obs_dim, spaces.action_dim
    scale = torch.from_numpy(spaces.action_scale)
    bias = torch.from_numpy(spaces.action_bias)

    class Actor(nn.Module):
        """Tanh-squashed Gaussian policy: ``trunk`` -> ``mean``, ``log_std`` heads."""

        def __init__(self) -> None:
            super().__init__()
            self.trunk = nn.Sequential(
                nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
            )
            self.mean = nn.Linear(hidden, action_dim)
            self.log_std = nn.Linear(hidden, action_dim)

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.trunk(obs)
            log_std = torch.tanh(self.log_std(h))
            log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1.0)
            return self.mean(h), log_std

        def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """A reparameterised action and its log probability (squash corrected)."""
            mean, log_std = self(obs)
            std = log_std.exp()
            u = mean + std * torch.randn_like(mean)
            y = torch.tanh(u)
            log_prob = -0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
            log_prob = log_prob - torch.log(scale * (1.0 - y.pow(2)) + 1e-6)
            return y * scale + bias, log_prob.sum(-1)

    class TwinQ(nn.Module):
        """Two independent Q networks ``Q(obs, action)``; the target uses their minimum."""

        def __init__(self) -> None:
            super().__init__()

            def q() -> nn.Module:
                return nn.Sequential(
                    nn.Linear(obs_dim + action_dim, hidden),
                    nn.ReLU(),
                    nn.Linear(hidden, hidden),
                    nn.ReLU(),
                    nn.Linear(hidden, 1),
                )

            self.q1, self.q2 = q(), q()

        def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
            x = torch.cat([obs, action], dim=1)
            return self.q1(x).squeeze(1), self.q2(x).squeeze(1)

    return Actor, TwinQ


class SacLearner:
    """SAC's learner: one gradient step of critics, actor and temperature per batch.

    Args:
        args: the run's hyperparameters.
        spaces: the env's observation size and action bounds.

    The learner also times itself: ``update_s`` (seconds inside :meth:`update`),
    ``updates`` and ``outside_s`` (seconds between consecutive updates, spent by the
    runtime getting the next batch and publishing weights).
    """

    def __init__(self, args: Args, spaces: Spaces):
        import torch

        torch.manual_seed(args.seed)
        Actor, TwinQ = build_networks(args.hidden, spaces)
        self.torch = torch
        self.args = args
        self.actor = Actor()
        self.q = TwinQ()
        self.q_target = TwinQ()
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=args.policy_lr, fused=True)
        self.q_opt = torch.optim.Adam(self.q.parameters(), lr=args.q_lr, fused=True)
        self.target_entropy = -float(spaces.action_dim)
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=args.alpha_lr, fused=True)
        self._online = list(self.q.parameters())
        self._target = list(self.q_target.parameters())
        self.update_s = 0.0
        self.outside_s = 0.0
        self.updates = 0
        self._last_end: float | None = None

    def update(self, batch: rlreplay.Sample) -> None:
        """One SAC step on ``batch.data`` (obs, action, reward, discount, next_obs)."""
        torch = self.torch
        start = time.perf_counter()
        if self._last_end is not None:
            self.outside_s += start - self._last_end
        data = batch.data
        obs = torch.from_numpy(data["obs"])
        action = torch.from_numpy(data["action"])
        reward = torch.from_numpy(data["reward"])
        discount = torch.from_numpy(data["discount"])  # gamma, or 0 after a termination
        next_obs = torch.from_numpy(data["next_obs"])
        alpha = self.log_alpha.exp().detach()

        with torch.no_grad():
            next_action, next_log_prob = self.actor.sample(next_obs)
            q1_next, q2_next = self.q_target(next_obs, next_action)
            target = reward + discount * (torch.min(q1_next, q2_next) - alpha * next_log_prob)
        q1, q2 = self.q(obs, action)
        q_loss = ((q1 - target) ** 2).mean() + ((q2 - target) ** 2).mean()
        self.q_opt.zero_grad()
        q_loss.backward()
        self.q_opt.step()

        new_action, log_prob = self.actor.sample(obs)
        q1_pi, q2_pi = self.q(obs, new_action)
        actor_loss = (alpha * log_prob - torch.min(q1_pi, q2_pi)).mean()
        self.actor_opt.zero_grad()
        actor_loss.backward()
        self.actor_opt.step()

        alpha_loss = -(self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad()
        alpha_loss.backward()
        self.alpha_opt.step()

        with torch.no_grad():
            torch._foreach_lerp_(self._target, self._online, self.args.tau)
        self.updates += 1
        self._last_end = time.perf_counter()
        self.update_s += self._last_end - start

    def params(self) -> dict[str, np.ndarray]:
        """Numpy copies of the actor's weights (what :class:`SacPolicy` acts with)."""
        return {k: v.detach().numpy().copy() for k, v in self.actor.state_dict().items()}


# ------------------------------------------------------------------ the run
def parse_args(argv: list[str] | None = None) -> Args:
    """:class:`Args` from command-line flags (every field is a ``--flag``; see
    :func:`rlreplay.runtime.flags.parse_flags`)."""
    return parse_flags(Args, argv, __doc__)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train SAC on ``--env-id`` and return the run's summary (also written to ``--out``).

    Raises:
        SystemExit: for an unknown flag (argparse).
        InvalidArgumentError: for a flag out of range, or the processes backend without
            pyzmq.
        ComponentFailedError: when the actor or the learner failed (see its message).
    """
    import torch

    args = parse_args(argv)
    if args.backend == "processes" and importlib.util.find_spec("zmq") is None:
        raise InvalidArgumentError(
            "--backend=processes serves the replay table to the actor process over ZeroMQ, "
            "and pyzmq is not installed; install it (python -m pip install 'rlreplay[net]') "
            "or choose --backend threads"
        )
    torch.set_num_threads(1)
    spaces = Spaces.of(args.env_id)
    sig = rlreplay.NStepTransitionAdder.signature(
        obs=((spaces.obs_dim,), "float32"),
        action=((spaces.action_dim,), "float32"),
        extras={"policy_version": "int64"},
    )
    replay = rt.ReplaySpec(
        signature=sig,
        layout=rlreplay.NStepTransitionAdder.layout(sig, n=1),
        adder=functools.partial(rlreplay.NStepTransitionAdder, n=1, discount=args.gamma),
        max_size=args.buffer_size,
        sampler=rlreplay.Uniform(),
    )
    config = rt.RuntimeConfig(
        backend=args.backend,
        seed=args.seed,
        batch_size=args.batch_size,
        updates_per_env_step=args.updates_per_env_step,
        min_size_to_sample=args.learning_starts,
        weight_sync_period=args.weight_sync_period,
        publish_every=args.publish_every,
        progress=args.progress,
        stats_every_steps=args.eval_every,  # evaluations at the same steps anywhere
        out_dir=args.out or None,
    )
    learner = SacLearner(args, spaces)
    mean_action = functools.partial(
        mean_action_return, episodes=args.eval_episodes, env_id=args.env_id, spaces=spaces
    )
    with report.Evaluations(mean_action, args.eval_every) as evaluations:
        result = rt.run(
            config,
            make_env=functools.partial(make_env, env_id=args.env_id, num_envs=args.num_envs),
            make_policy=functools.partial(
                SacPolicy, spaces=spaces, random_steps=args.learning_starts
            ),
            learner=learner,
            replay=replay,
            total_env_steps=args.total_steps,
            on_stats=evaluations,
        )
    summary = report.summarize(result.rows, args.target_return, config.ratio)
    run_summary = result.summary
    wall = run_summary.get("wall_s") or 0.0
    busy = learner.update_s + learner.outside_s
    summary.update(
        env_id=args.env_id,
        backend=args.backend,
        seed=args.seed,
        updates=run_summary["updates"],
        update_ms_mean=1e3 * learner.update_s / max(learner.updates, 1),
        learner_wait_frac=run_summary["learner_wait_s"] / wall if wall > 0 else None,
        learner_outside_update_frac=learner.outside_s / busy if busy > 0 else None,
    )
    if args.out:
        title = f"SAC on {args.env_id} (seed {args.seed}, {args.backend})"
        report.write_outputs(args.out, result.rows, summary, title=title)
    return summary


if __name__ == "__main__":
    run_script(main)
