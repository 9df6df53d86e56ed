"""DQN on CartPole-v1 with prioritized replay and n-step returns, through rlreplay's runtime.

One readable file in the CleanRL style: double DQN with a Huber loss, a target network
that follows the Q network by Polyak averaging (``target_tau`` of the way after every
update), n-step returns made by :class:`~rlreplay.NStepTransitionAdder`, and proportional
prioritized replay (:class:`~rlreplay.Prioritized`) whose importance weights are annealed
to 1. Acting and learning meet only through the replay table; the ratio of gradient
updates to env steps (``updates_per_env_step``) is held by the table's rate limiter, not by
this file's control flow.

Ending at the target, not only reaching it: with a target network copied every 50 updates
the greedy return reached 500 and then fell back on some seeds late in the run (one 50k-step
run ended at 337.7, another at 452): each copy moves every bootstrap target at once while
the learning rate is still high. The averaged target moves them a little after every
update, the learning rate decays linearly to 0 so the final weights are the ones the run
settled on, and each evaluation is the mean of 20 greedy episodes (with 10, one early
failure moves the mean by 50). With that, about one seed in twenty still ended low, its
greedy policy holding the pole up while the cart drifted off the track (every one of 20
greedy episodes of seed 106 ended at x = -2.4 after about 130 steps): once the policy
balances, exploring with epsilon 0.04 fills the table with states on its own path, and
the Q values of a slow drift towards the edge are learned from few transitions. Exploring
with 0.1 to the end keeps such states in the table (0.04 ended seed 106 at 132).

With 3-step returns about one run in ten still fell back after reaching 500, on either
backend, and stayed down for thousands of steps: seed 313's training returns sat near 130
for 10k env steps, every episode ending with the cart off the track, before it recovered.
The Q network must learn there that a slow drift ends the episode 100 or more steps later,
and each n-step target carries that news back n steps per turn of the target network,
which follows the Q network with a time constant of 1 / ``target_tau`` = 200 updates.
10-step returns carry it back more than three times as fast. On seeds 300-319, 3-step
returns ended 2 runs of 20 below 475 on each backend; 10-step returns ended all 25 of
seeds 300-324 at 500 (``inline``) and all 20 of seeds 400-419 at 496 or more
(``threads``), where 5-step returns ended 25 of 25 and 18 of 20; on seeds 500-519,
600-619 and 700-719, which chose nothing, ``inline`` ended 59 of 60 at the target and
``threads`` 57, then ``threads`` 60 of 60 on seeds 800-819 and 900-939 (the runs that
failed never reached it; each backend failed on other seeds). A faster target network
(``target_tau`` 0.02, 3-step returns) ended 3 of 24 low; uniform replay, larger batches,
a lower learning rate, more exploration and a smaller network each failed one of 6 to 9
(docs/learning.md).
``python -m benchmarks.learning --agents dqn`` judges the final evaluation of 10 seeds
other than this file's.

Who owns what:

* the actor (built by the runtime, in a thread or a process) holds a :class:`QPolicy`: the
  Q network in numpy (acting needs no torch), epsilon-greedy over a vector of envs, fed
  new weights every ``weight_sync_period`` env steps;
* the learner (:class:`DqnLearner`, in the driver) holds the torch Q and target networks
  and the optimizer; :meth:`DqnLearner.update` is one gradient step on one sampled batch
  and returns the batch's new priorities (``|TD error|``);
* an evaluator process scores the newest weights greedily every ``eval_every`` env steps
  and at the end (:func:`greedy_return`); the driver writes ``metrics.csv``,
  ``summary.json`` and ``learning_curve.png`` to ``--out``.

Run it::

    python examples/dqn_cartpole.py --seed 0 --total-steps 50000 --out runs/dqn_cartpole

The summary holds the common keys of :mod:`rlreplay.runtime.report` (``final_eval_return``,
``steps_to_target`` for a mean greedy return of 475, ...) plus ``updates`` and the backend.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Any

import numpy as np

import rlreplay
import rlreplay.runtime as rt
from rlreplay.errors import InvalidArgumentError
from rlreplay.runtime import report
from rlreplay.runtime.flags import check_ranges, parse_flags, run_script

ENV_ID = "CartPole-v1"
OBS_DIM = 4
NUM_ACTIONS = 2
TARGET_RETURN = 475.0


@dataclass
class Args:
    """Command-line flags (``--total-steps`` for ``total_steps`` and so on)."""

    seed: int = 0
    """seed of the env, the policy's random generator, torch and the replay table"""
    total_steps: int = 50_000
    """env steps to take, summed over the vector env's envs"""
    backend: str = "threads"
    """runtime backend: threads (the actor's env loop in a thread beside the learner's, the
    fastest here: acting is 4% of the work), processes (the actor in its own process, for
    envs that cost as much as learning; needs the net extra) or inline (one thread,
    exactly reproducible)"""
    out: str = "runs/dqn_cartpole"
    """folder for metrics.csv, summary.json and learning_curve.png ('' writes nothing)"""
    num_envs: int = 4
    """envs in each actor's vector env (one batched policy call steps them all)"""
    num_actors: int = 1
    """actors, each with its own vector env and seed"""
    replay_shards: int = 1
    """replay servers the table is sharded over (--backend ray only)"""
    buffer_size: int = 50_000
    """most n-step transitions the replay table holds"""
    batch_size: int = 64
    """transitions per gradient step"""
    updates_per_env_step: float = 0.5
    """gradient steps per env step, held by the table's rate limiter"""
    learning_starts: int = 1_000
    """transitions the table must hold before the first gradient step"""
    n_step: int = 10
    """steps summed into each transition's return before bootstrapping (10: see the
    module's docstring)"""
    gamma: float = 0.99
    """discount"""
    lr: float = 2.3e-3
    """Adam learning rate at the start; it decays linearly to 0 over the run's updates"""
    hidden: int = 128
    """units in each of the Q network's two hidden layers"""
    target_update_every: int = 1
    """learner updates between moves of the target network towards the Q network"""
    target_tau: float = 0.005
    """each move takes the target network this fraction of the way to the Q network:
    Polyak averaging (1 with target_update_every 50 would copy it every 50 updates)"""
    max_grad_norm: float = 10.0
    """gradients are clipped to this global norm"""
    eps_start: float = 1.0
    """exploration epsilon at the first env step"""
    eps_end: float = 0.1
    """exploration epsilon after eps_decay_steps (0.1: see the module's docstring)"""
    eps_decay_steps: int = 8_000
    """env steps over which epsilon decays linearly"""
    priority_exponent: float = 0.6
    """alpha of prioritized replay (0: uniform)"""
    beta_start: float = 0.4
    """importance-weight exponent at the start, annealed linearly to 1 over the run"""
    weight_sync_period: int = 20
    """env steps between the actor's pulls of new weights"""
    publish_every: int = 5
    """learner updates between weight publications"""
    eval_every: int = 2_500
    """env steps between greedy evaluations"""
    eval_episodes: int = 20
    """episodes per evaluation (greedy, no exploration)"""
    progress: bool = True
    """show the runtime's progress bar (--no-progress: none)"""

    def __post_init__(self) -> None:
        """Check the values the runtime does not check itself.

        Raises:
            InvalidArgumentError: naming the flag, its value and the range it must be in.
        """
        check_ranges(
            self,
            counts=("total_steps", "num_envs", "num_actors", "buffer_size", "n_step", "hidden",
                    "target_update_every", "eps_decay_steps", "eval_every", "eval_episodes",
                    "replay_shards", "batch_size", "weight_sync_period", "publish_every",
                    "learning_starts"),
            non_negative=("seed",),
            positive=("lr", "max_grad_norm", "updates_per_env_step"),
            fractions=("gamma", "eps_start", "eps_end", "priority_exponent", "beta_start"),
            open_fractions=("target_tau",),
            at_most=(("batch_size", "buffer_size"), ("learning_starts", "buffer_size")),
        )


# ------------------------------------------------------------------ environments
def make_env(seed: int, num_envs: int = 4) -> Any:
    """The actor's vector env (the runtime resets it with ``seed``)."""
    import gymnasium as gym

    return gym.make_vec(ENV_ID, num_envs=num_envs, vectorization_mode="sync")


def make_eval_env(seed: int) -> Any:
    """One env for evaluation (:func:`rlreplay.runtime.report.evaluate` seeds its resets)."""
    import gymnasium as gym

    return gym.make(ENV_ID)


# ------------------------------------------------------------------ acting (numpy)
def q_values(params: dict[str, np.ndarray], obs: np.ndarray) -> np.ndarray:
    """Q values [B, NUM_ACTIONS] of ``obs`` [B, OBS_DIM], in numpy.

    The same computation as the torch Q network on the same weights (a test checks it).
    """
    h = np.maximum(obs @ params["0.weight"].T + params["0.bias"], 0.0)
    h = np.maximum(h @ params["2.weight"].T + params["2.bias"], 0.0)
    return h @ params["4.weight"].T + params["4.bias"]


def greedy_return(params: dict[str, np.ndarray], episodes: int) -> float:
    """Mean greedy return of ``params`` over ``episodes`` episodes (run in the evaluator's
    process, see :class:`rlreplay.runtime.report.Evaluations`)."""

    def act(obs: np.ndarray) -> int:
        return int(q_values(params, obs[None]).argmax())

    return report.evaluate(make_eval_env, act, episodes)


def epsilon(env_steps: int, args: Args) -> float:
    """Exploration rate after ``env_steps``: linear from eps_start to eps_end."""
    frac = min(1.0, env_steps / args.eps_decay_steps)
    return args.eps_start + frac * (args.eps_end - args.eps_start)


class QPolicy:
    """The actor's policy: epsilon-greedy on the newest Q weights it was given.

    Args:
        actor_index: this actor's index (unused: one epsilon schedule for all).
        num_actors: actors in the run (unused).
        seed: seeds this policy's random generator.
        args: the run's hyperparameters (the epsilon schedule).
    """

    def __init__(self, actor_index: int, num_actors: int, seed: int, args: Args):
        self.rng = np.random.default_rng(seed)
        self.args = args
        self.params: dict[str, np.ndarray] | None = None

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        """Act with ``params`` (numpy arrays named as in the torch Q network) from now on."""
        self.params = params

    def __call__(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        """Actions [num_envs] (int64) for ``obs`` [num_envs, OBS_DIM]."""
        n = len(obs)
        random_actions = self.rng.integers(NUM_ACTIONS, size=n)
        if self.params is None:
            return random_actions
        greedy = q_values(self.params, np.asarray(obs, dtype=np.float32)).argmax(axis=1)
        explore = self.rng.random(n) < epsilon(env_steps, self.args)
        return np.where(explore, random_actions, greedy).astype(np.int64)


# ------------------------------------------------------------------ learning (torch)
def build_q_network(hidden: int) -> Any:
    """The Q network: obs -> hidden -> hidden -> one value per action (torch imported here)."""
    from torch import nn

    return nn.Sequential(
        nn.Linear(OBS_DIM, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, NUM_ACTIONS),
    )


class DqnLearner:
    """Double DQN on n-step transitions, weighted by prioritized replay's importance weights.

    The learning rate decays linearly to 0 and the importance exponent beta rises linearly
    to 1 over the run's expected updates (``total_steps * updates_per_env_step``).

    Args:
        args: the run's hyperparameters.
    """

    def __init__(self, args: Args):
        import torch

        torch.manual_seed(args.seed)
        self.torch = torch
        self.args = args
        self.q = build_q_network(args.hidden)
        self.q_target = build_q_network(args.hidden)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self._online = list(self.q.parameters())
        self._target = list(self.q_target.parameters())
        # fused: one kernel for all parameters (on CPU a third of the step's time is Adam's)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=args.lr, fused=True)
        self.expected_updates = max(1.0, args.total_steps * args.updates_per_env_step)
        self.updates = 0

    def update(self, batch: rlreplay.Sample) -> np.ndarray:
        """One gradient step on ``batch.data`` (obs, action, reward, discount, next_obs).

        ``reward`` is the n-step discounted return and ``discount`` is ``gamma ** n``, or 0
        when the episode terminated within the n steps (a truncation still bootstraps).

        Returns:
            New priorities for ``batch.info.keys``: ``|TD error|`` (float64 [B]).
        """
        torch, args = self.torch, self.args
        progress = min(1.0, self.updates / self.expected_updates)
        for group in self.optimizer.param_groups:
            group["lr"] = args.lr * (1.0 - progress)
        beta = args.beta_start + (1.0 - args.beta_start) * progress
        data = batch.data
        obs = torch.from_numpy(data["obs"])
        action = torch.from_numpy(data["action"])
        reward = torch.from_numpy(data["reward"])
        discount = torch.from_numpy(data["discount"])
        next_obs = torch.from_numpy(data["next_obs"])
        weight = torch.from_numpy(batch.importance_weights(beta).astype(np.float32))

        with torch.no_grad():  # double DQN: the online net picks, the target net values
            best = self.q(next_obs).argmax(dim=1, keepdim=True)
            target = reward + discount * self.q_target(next_obs).gather(1, best).squeeze(1)
        predicted = self.q(obs).gather(1, action[:, None]).squeeze(1)
        loss = torch.nn.functional.smooth_l1_loss(predicted, target, reduction="none")
        loss = (weight * loss).mean()
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.q.parameters(), args.max_grad_norm)
        self.optimizer.step()

        self.updates += 1
        if self.updates % args.target_update_every == 0:
            if args.target_tau == 1.0:
                self.q_target.load_state_dict(self.q.state_dict())
            else:
                with torch.no_grad():
                    torch._foreach_lerp_(self._target, self._online, args.target_tau)
        td_error = (target - predicted).detach().abs().double().numpy()
        return td_error + 1e-3  # never 0: every item keeps a chance to be sampled

    def params(self) -> dict[str, np.ndarray]:
        """Numpy copies of the Q network's weights (what :class:`QPolicy` acts with)."""
        return {k: v.detach().numpy().copy() for k, v in self.q.state_dict().items()}


# ------------------------------------------------------------------ the run
def parse_args(argv: list[str] | None = None, args_class: type[Args] = Args) -> Args:
    """``args_class`` (:class:`Args` or a subclass) from command-line flags (every field
    is a ``--flag``; see :func:`rlreplay.runtime.flags.parse_flags`)."""
    return parse_flags(args_class, argv, __doc__)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train DQN on CartPole-v1 and return the run's summary (also written to ``--out``).

    Raises:
        SystemExit: for an unknown flag (argparse).
        InvalidArgumentError: for a flag out of range, or the processes backend without
            pyzmq.
        ComponentFailedError: when the actor or the learner failed (see its message).
    """
    return train(parse_args(argv))


def train(args: Args, policy: type[QPolicy] = QPolicy) -> dict[str, Any]:
    """Train with ``args``, actors acting with ``policy`` (a :class:`QPolicy` class);
    returns the summary (see :func:`main`)."""
    import torch

    if args.backend == "processes" and importlib.util.find_spec("zmq") is None:
        raise InvalidArgumentError(
            "--backend=processes serves the replay table to the actor process over ZeroMQ, "
            "and pyzmq is not installed; install it (python -m pip install 'rlreplay[net]') "
            "or choose --backend threads"
        )
    torch.set_num_threads(1)
    sig = rlreplay.NStepTransitionAdder.signature(
        obs=((OBS_DIM,), "float32"), action="int64", extras={"policy_version": "int64"}
    )
    replay = rt.ReplaySpec(
        signature=sig,
        layout=rlreplay.NStepTransitionAdder.layout(sig, n=args.n_step),
        adder=functools.partial(rlreplay.NStepTransitionAdder, n=args.n_step, discount=args.gamma),
        max_size=args.buffer_size,
        sampler=rlreplay.Prioritized(priority_exponent=args.priority_exponent),
    )
    config = rt.RuntimeConfig(
        backend=args.backend,
        num_actors=args.num_actors,
        replay_shards=args.replay_shards if args.backend == "ray" else 1,
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
    learner = DqnLearner(args)
    greedy = functools.partial(greedy_return, episodes=args.eval_episodes)
    with report.Evaluations(greedy, args.eval_every) as evaluations:
        result = rt.run(
            config,
            make_env=functools.partial(make_env, num_envs=args.num_envs),
            make_policy=functools.partial(policy, args=args),
            learner=learner,
            replay=replay,
            total_env_steps=args.total_steps,
            on_stats=evaluations,
        )
    rows = result.rows  # the final row has env_steps >= total_steps, so it is evaluated
    summary = report.summarize(rows, TARGET_RETURN, config.ratio)
    summary.update(
        backend=args.backend,
        num_actors=args.num_actors,
        seed=args.seed,
        updates=result.summary["updates"],
    )
    if args.out:
        title = f"DQN on {ENV_ID} (seed {args.seed}, {args.backend})"
        report.write_outputs(args.out, rows, summary, title=title)
    return summary


if __name__ == "__main__":
    run_script(main)
