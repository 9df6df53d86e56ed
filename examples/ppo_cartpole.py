"""PPO with GAE on CartPole-v1, on-policy through a queue table.

One readable file in CleanRL's style. Acting and learning meet only through replay:

* an actor steps a gymnasium vector env of ``num_envs`` CartPoles with one batched policy
  call per vector step and hands each step to the library's
  :class:`~rlreplay.RolloutAdder`, which writes one stored row per *vector* step (every
  field ``[num_envs, ...]``) and, every ``num_steps`` vector steps, one item: the whole
  rollout, ``num_steps + 1`` rows (the last row holds the observation to bootstrap from);
* the replay table is a queue (``ReplaySpec(on_policy=True)``): each rollout is sampled
  exactly once, and with ``max_policy_lag=0`` an actor that finished a rollout waits for
  weights trained on it, so every rollout is collected by the newest policy;
* the learner takes ``num_actors`` rollouts per update (one per actor), computes GAE
  advantages and runs ``update_epochs`` epochs of clipped PPO over them.

Episode boundaries. Gymnasium's vector envs autoreset in the *next* step: the step that
ends an episode returns the true final observation, and the following step ignores its
action and returns the reset observation (reward 0). So in a rollout:

* a step that *terminated* has no future: its target is its reward;
* a step that was *truncated* (CartPole's 500-step limit) bootstraps from the value of
  the final observation, which is the next row's observation;
* the following autoreset step is not a transition: it gets no advantage, no loss, and
  the advantage recursion does not run across it (:func:`gae`).

Run:  python examples/ppo_cartpole.py --seed 0 --total-steps 200000 --out runs/ppo_cartpole
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import rlreplay.runtime as rt
from rlreplay import RolloutAdder
from rlreplay.errors import InvalidArgumentError
from rlreplay.runtime import report
from rlreplay.runtime.flags import check_ranges, parse_flags, run_script

OBS_SHAPE = (4,)
NUM_ACTIONS = 2


@dataclass
class Args:
    """The run's configuration; every field is a command-line flag (``--total-steps``).

    The PPO hyperparameters are rl-baselines3-zoo's tuned ones for CartPole-v1: 8 envs x
    32 steps per rollout, 20 epochs of one minibatch, gamma 0.98, lambda 0.8, learning
    rate 1e-3 and clip 0.2 both decaying linearly, no entropy bonus.
    """

    seed: int = 0
    """seed of the run (environments, network initialisation, action sampling)"""
    total_steps: int = 200_000
    """environment steps to collect, summed over actors and environments"""
    backend: str = "processes"
    """runtime backend: processes (actors in their own processes), threads or inline"""
    out: str = "runs/ppo_cartpole"
    """folder for metrics.csv, summary.json and learning_curve.png ('' writes nothing)"""
    num_actors: int = 1
    """actor loops; each learner update takes one rollout of each"""
    num_envs: int = 8
    """CartPoles in each actor's vector env"""
    num_steps: int = 32
    """vector steps per rollout (one item of num_steps + 1 rows)"""
    gamma: float = 0.98
    """discount factor"""
    gae_lambda: float = 0.8
    """lambda of generalised advantage estimation"""
    learning_rate: float = 1e-3
    """Adam learning rate (annealed linearly to 0 over total_steps)"""
    update_epochs: int = 20
    """passes over each batch of rollouts"""
    num_minibatches: int = 1
    """minibatches per epoch"""
    clip_coef: float = 0.2
    """PPO ratio clip (annealed linearly to 0 with the learning rate)"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient norm clip"""
    target: float = 450.0
    """evaluation return the run aims for (steps_to_target)"""
    eval_every: int = 10_000
    """env steps between evaluations during the run"""
    eval_episodes: int = 20
    """greedy episodes per evaluation"""
    timeout_s: float = 60.0
    """longest any component waits before the run fails"""
    progress: bool = True
    """show a progress bar / progress lines"""


# ---------------------------------------------------------------------------------------
# Environments and the network


def make_env(seed: int, num_envs: int = 8) -> gym.vector.VectorEnv:
    """The actor's vector env (the runtime resets it with ``seed``)."""
    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")


def make_eval_env(seed: int) -> gym.Env:
    """One CartPole for greedy evaluation."""
    return gym.make("CartPole-v1")


def layer(n_in: int, n_out: int, std: float = np.sqrt(2)) -> nn.Linear:
    """A linear layer with orthogonal weights and zero bias (as in CleanRL's PPO)."""
    lin = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, 0.0)
    return lin


class Agent(nn.Module):
    """Separate actor and critic MLPs (64-64, tanh)."""

    def __init__(self) -> None:
        super().__init__()
        n = int(np.prod(OBS_SHAPE))
        self.critic = nn.Sequential(
            layer(n, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, std=1.0)
        )
        self.actor = nn.Sequential(
            layer(n, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, NUM_ACTIONS, std=0.01)
        )

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.actor(obs))


def agent_params(agent: Agent) -> dict[str, np.ndarray]:
    """Numpy copies of the agent's weights (what the learner publishes)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in agent.state_dict().items()}


def load_params(agent: Agent, params: dict[str, np.ndarray]) -> None:
    """Load published numpy weights into ``agent``."""
    agent.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in params.items()})


# ---------------------------------------------------------------------------------------
# Generalised advantage estimation over rollouts with episode boundaries


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    valid: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and value targets of ``T`` steps of ``M`` independent streams.

    Args:
        rewards, terminated, truncated: ``[T, M]``, the result of step ``t``.
        values: ``[T + 1, M]``: ``V(obs_t)``; row ``T`` is the observation after the last
            step. After a truncation at ``t``, row ``t + 1`` must hold the value of the
            true final observation (gymnasium's next-step autoreset stores it there).
        valid: ``[T, M]`` bool, False for rows that are no transition (the autoreset
            step after an episode ended, or padding after an episode's end).
        gamma, lam: discount and GAE lambda.

    A terminated step's target is its reward; a truncated step bootstraps from the
    next row's value; the recursion never runs across an episode end, and invalid rows
    get advantage 0 and target ``values[t]``.

    Returns:
        ``(advantages, returns)``, both ``[T, M]`` float32, ``returns = advantages +
        values[:T]``.
    """
    T = rewards.shape[0]
    adv = np.zeros(rewards.shape, dtype=np.float32)
    running = np.zeros(rewards.shape[1:], dtype=np.float32)
    bootstrap = ~np.asarray(terminated, bool)
    going_on = bootstrap & ~np.asarray(truncated, bool)
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * values[t + 1] * bootstrap[t] - values[t]
        running = np.where(valid[t], delta + gamma * lam * going_on[t] * running, 0.0)
        adv[t] = running
    return adv, (adv + values[:T]).astype(np.float32)


# ---------------------------------------------------------------------------------------
# Acting


class PpoPolicy:
    """The actor's policy: samples actions from the newest published weights and gives
    the log-probability and value of each as extras.

    Args:
        actor_index, num_actors: this actor's place among the actors.
        seed: the run's seed (each actor samples actions from its own generator).
    """

    def __init__(self, actor_index: int, num_actors: int, seed: int):
        torch.set_num_threads(1)
        self.agent = Agent()
        self.generator = torch.Generator().manual_seed(seed * 1_000 + actor_index)

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        load_params(self.agent, params)

    def __call__(self, obs: np.ndarray, env_steps: int) -> tuple[np.ndarray, dict]:
        with torch.no_grad():
            x = torch.as_tensor(obs, dtype=torch.float32)
            logp_all = torch.log_softmax(self.agent.actor(x), dim=-1)
            action = torch.multinomial(logp_all.exp(), 1, generator=self.generator)
            logp = logp_all.gather(-1, action).squeeze(-1)
            value = self.agent.value(x)
        extras = {"logp": logp.numpy(), "value": value.numpy()}
        return action.squeeze(-1).numpy(), extras


# ---------------------------------------------------------------------------------------
# Learning


def rollout_columns(x: np.ndarray) -> np.ndarray:
    """``[B, T + 1, N, ...]`` (items, rows, envs) as ``[T + 1, B * N, ...]``: one column
    per environment stream."""
    x = np.swapaxes(np.asarray(x), 0, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])


class PpoLearner:
    """Clipped PPO over a batch of rollouts (one per actor) per update.

    The rows' ``logp`` and ``value`` are the acting policy's; the bootstrap row's value
    is computed here with the learner's weights, which with ``max_policy_lag=0`` are the
    acting ones. The learning rate and the clip range decay linearly to 0 over the
    run's updates.
    """

    def __init__(self, args: Args):
        torch.set_num_threads(1)
        torch.manual_seed(args.seed)
        self.args = args
        self.agent = Agent()
        self.optimizer = torch.optim.Adam(
            self.agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True
        )
        per_update = args.num_steps * args.num_envs * args.num_actors
        self.total_updates = max(1, args.total_steps // per_update)
        self.generator = torch.Generator().manual_seed(args.seed)
        self.updates = 0
        self.items_sampled = 0
        self.keys_seen: set[int] = set()
        self.items_repeated = 0
        # The last update's diagnostics (columns of metrics.csv from the first row on).
        self.stats: dict[str, float | None] = dict.fromkeys(
            ("approx_kl", "clipfrac", "value_loss", "learning_rate")
        )

    def params(self) -> dict[str, np.ndarray]:
        return agent_params(self.agent)

    def update(self, batch: Any) -> None:
        """One PPO update on ``batch`` (``batch.data`` fields ``[B, T + 1, N, ...]``)."""
        args = self.args
        keys = np.asarray(batch.info.keys).tolist()
        self.items_repeated += sum(k in self.keys_seen for k in keys)
        self.keys_seen.update(keys)
        self.items_sampled += len(keys)
        d = {k: rollout_columns(v) for k, v in batch.data.items()}
        T = d["reward"].shape[0] - 1
        obs = torch.as_tensor(d["obs"])
        values = d["value"].astype(np.float32)
        with torch.no_grad():
            values[T] = self.agent.value(obs[T]).numpy()
        valid = ~d["autoreset"][:T]
        adv, ret = gae(
            d["reward"][:T],
            values,
            d["terminated"][:T],
            d["truncated"][:T],
            valid,
            args.gamma,
            args.gae_lambda,
        )
        idx = np.flatnonzero(valid.reshape(-1))
        b_obs = obs[:T].reshape(-1, *OBS_SHAPE)[idx]
        b_act = torch.as_tensor(d["action"][:T].reshape(-1)[idx])
        b_logp = torch.as_tensor(d["logp"][:T].reshape(-1)[idx])
        b_adv = torch.as_tensor(adv.reshape(-1)[idx])
        b_ret = torch.as_tensor(ret.reshape(-1)[idx])

        frac = max(0.0, 1.0 - self.updates / self.total_updates)
        for group in self.optimizer.param_groups:
            group["lr"] = args.learning_rate * frac
        clip = args.clip_coef * frac
        n = len(idx)
        mb = max(1, -(-n // args.num_minibatches))
        clipfracs, kls = [], []
        for _ in range(args.update_epochs):
            perm = torch.randperm(n, generator=self.generator)
            for start in range(0, n, mb):
                j = perm[start : start + mb]
                dist = self.agent.dist(b_obs[j])
                logratio = dist.log_prob(b_act[j]) - b_logp[j]
                ratio = logratio.exp()
                with torch.no_grad():
                    kls.append(((ratio - 1) - logratio).mean().item())
                    clipfracs.append(((ratio - 1.0).abs() > clip).float().mean().item())
                a = b_adv[j]
                if len(j) > 1:
                    a = (a - a.mean()) / (a.std() + 1e-8)
                pg_loss = torch.max(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip)).mean()
                v_loss = 0.5 * ((self.agent.value(b_obs[j]) - b_ret[j]) ** 2).mean()
                entropy = dist.entropy().mean()
                loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.agent.parameters(), args.max_grad_norm)
                self.optimizer.step()
        self.updates += 1
        self.stats = {
            "approx_kl": float(np.mean(kls)),
            "clipfrac": float(np.mean(clipfracs)),
            "value_loss": float(v_loss.item()),
            "learning_rate": args.learning_rate * frac,
        }
        return None


# ---------------------------------------------------------------------------------------
# Evaluation and the run


class GreedyReturn:
    """``params -> mean greedy return`` over ``episodes`` episodes: the torch actor loaded
    with the published weights picks the most likely action (run in the evaluator's
    process, see :class:`rlreplay.runtime.report.Evaluations`)."""

    def __init__(self, episodes: int):
        self.episodes = episodes
        self.agent: Agent | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "agent": None}  # built where it evaluates

    def __call__(self, params: dict[str, np.ndarray]) -> float:
        if self.agent is None:
            torch.set_num_threads(1)
            self.agent = Agent()
        agent = self.agent
        load_params(agent, params)

        def act(obs: np.ndarray) -> int:
            with torch.no_grad():
                return int(agent.actor(torch.as_tensor(obs, dtype=torch.float32)).argmax())

        return report.evaluate(make_eval_env, act, self.episodes)


def parse_args(argv: list[str] | None = None) -> Args:
    """``Args`` from the command line (every field is a ``--flag``)."""
    return parse_flags(Args, argv, __doc__)


def check_args(args: Args) -> None:
    """Refuse values the run cannot use, before anything starts.

    Raises:
        InvalidArgumentError: naming the flag, its value and what it must be.
    """
    check_ranges(
        args,
        counts=("total_steps", "num_actors", "num_envs", "num_steps", "update_epochs",
                "num_minibatches", "eval_every", "eval_episodes"),
        non_negative=("seed",),
        positive=("learning_rate", "max_grad_norm", "timeout_s"),
        fractions=("gamma", "gae_lambda"),
    )
    rollout = args.num_envs * args.num_steps
    if args.num_minibatches > rollout:
        raise InvalidArgumentError(
            f"--num-minibatches={args.num_minibatches} must be at most --num-envs x "
            f"--num-steps={rollout}, the items of a rollout it splits"
        )


def main(argv: list[str] | None = None) -> dict:
    """Train PPO on CartPole-v1 through a queue table; returns the run's summary.

    The summary holds the keys of :func:`rlreplay.runtime.report.summarize` plus the
    runtime's ``items_inserted`` / ``items_sampled`` (equal: each rollout is consumed
    exactly once), the learner's ``items_repeated`` (0) and the configuration.
    """
    args = parse_args(argv)
    check_args(args)
    torch.set_num_threads(1)
    # One row per vector step (every field [num_envs, ...]); logp and value are the acting
    # policy's, policy_version the version of the weights that acted.
    signature = RolloutAdder.signature(
        obs=(OBS_SHAPE, "float32"),
        action="int64",
        num_envs=args.num_envs,
        extras={"logp": "float32", "value": "float32"},
    )
    replay = rt.ReplaySpec(
        signature=signature,
        layout=RolloutAdder.layout(signature, args.num_steps),
        adder=functools.partial(RolloutAdder, num_steps=args.num_steps),
        # With max_policy_lag=0 at most one rollout per actor waits; the room for four
        # gives a remote writer (processes backend) the history of a whole rollout.
        max_size=4 * args.num_actors,
        on_policy=True,
    )
    config = rt.RuntimeConfig(
        backend=args.backend,
        num_actors=args.num_actors,
        seed=args.seed,
        batch_size=args.num_actors,  # one rollout of each actor per update
        weight_sync_period=args.num_steps * args.num_envs,  # one rollout between syncs
        max_policy_lag=0,  # each rollout is collected by the newest weights
        progress=args.progress,
        stats_every_steps=args.eval_every,  # evaluations at the same steps anywhere
        out_dir=args.out or None,
        timeout_s=args.timeout_s,
    )
    learner = PpoLearner(args)
    with report.Evaluations(GreedyReturn(args.eval_episodes), args.eval_every) as evaluations:
        result = rt.run(
            config,
            make_env=functools.partial(make_env, num_envs=args.num_envs),
            make_policy=PpoPolicy,
            learner=learner,
            replay=replay,
            total_env_steps=args.total_steps,
            on_stats=lambda row, weights: {**evaluations(row, weights), **learner.stats},
        )
    rows = result.rows  # the final row evaluates the final weights
    summary = report.summarize(rows, args.target, None)
    summary.update(
        updates=result.summary["updates"],
        items_inserted=result.summary["items_inserted"],
        items_sampled=result.summary["items_sampled"],
        items_repeated=learner.items_repeated,
        backend=args.backend,
        config=asdict(args),
    )
    if args.out:
        title = f"PPO on CartPole-v1 (seed {args.seed}, {args.backend})"
        report.write_outputs(args.out, rows, summary, title=title)
    return summary


if __name__ == "__main__":
    run_script(main)
