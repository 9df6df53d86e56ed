"""A small DQN on CartPole-v1 fed through the n-step adder and a prioritized table.

Used by the learning tests; kept separate so the short and the slow variants share it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlreplay import MinSize, NStepTransitionAdder, Prioritized, Table, learn_while_can_sample


@dataclass
class DqnConfig:
    env_steps: int = 24_000
    num_envs: int = 4
    n_step: int = 3
    gamma: float = 0.99
    batch_size: int = 64
    lr: float = 1e-3
    target_every: int = 200
    learning_starts: int = 1_000
    eps_end_step: int = 8_000
    beta: float = 0.4
    eval_episodes: int = 10
    seed: int = 0


def random_policy_return(episodes: int = 20, seed: int = 0) -> float:
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    total = 0.0
    for e in range(episodes):
        env.reset(seed=seed + e)
        done = False
        while not done:
            _, r, term, trunc, _ = env.step(int(rng.integers(2)))
            total += r
            done = term or trunc
    env.close()
    return total / episodes


def train_dqn(cfg: DqnConfig) -> dict:
    """Train and return ``{"eval_return": mean greedy return, ...}``."""
    import gymnasium as gym
    import torch
    from torch import nn

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(cfg.seed)
    envs = gym.make_vec("CartPole-v1", num_envs=cfg.num_envs, vectorization_mode="sync")
    sig = NStepTransitionAdder.signature(obs=((4,), "float32"), action="int64")
    table = Table(
        "replay",
        signature=sig,
        max_size=50_000,
        layout=NStepTransitionAdder.layout(sig, n=cfg.n_step),
        sampler=Prioritized(priority_exponent=0.6),
        rate_limiter=MinSize(cfg.learning_starts),
        seed=cfg.seed,
    )
    adder = NStepTransitionAdder(
        table, n=cfg.n_step, discount=cfg.gamma, num_envs=cfg.num_envs, chunk_length=16
    )

    def mlp() -> nn.Module:
        return nn.Sequential(
            nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2)
        )

    q, target = mlp(), mlp()
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=cfg.lr)
    updates = 0

    def learn(batch) -> None:
        nonlocal updates
        d = {k: torch.from_numpy(v) for k, v in batch.data.items()}
        w = torch.from_numpy(batch.importance_weights(cfg.beta).astype(np.float32))
        with torch.no_grad():
            best = q(d["next_obs"]).argmax(1, keepdim=True)
            boot = target(d["next_obs"]).gather(1, best).squeeze(1)
            y = d["reward"] + d["discount"] * boot
        pred = q(d["obs"]).gather(1, d["action"][:, None]).squeeze(1)
        td = y - pred
        loss = (w * nn.functional.smooth_l1_loss(pred, y, reduction="none")).mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(q.parameters(), 10.0)
        opt.step()
        table.update_priorities(batch.info.keys, td.abs().detach().numpy() + 1e-3)
        updates += 1
        if updates % cfg.target_every == 0:
            target.load_state_dict(q.state_dict())

    obs, _ = envs.reset(seed=cfg.seed)
    adder.reset(obs)
    steps = 0
    while steps < cfg.env_steps:
        eps = max(0.05, 1.0 - 0.95 * steps / cfg.eps_end_step)
        with torch.no_grad():
            greedy = q(torch.from_numpy(obs.astype(np.float32))).argmax(1).numpy()
        explore = rng.random(cfg.num_envs) < eps
        action = np.where(explore, rng.integers(2, size=cfg.num_envs), greedy)
        obs, reward, term, trunc, info = envs.step(action)
        adder.add(action, reward, obs, term, trunc, info)
        steps += cfg.num_envs
        learn_while_can_sample(table, cfg.batch_size, learn, max_batches=1)
    envs.close()

    env = gym.make("CartPole-v1")
    returns = []
    for e in range(cfg.eval_episodes):
        o, _ = env.reset(seed=10_000 + e)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                a = int(q(torch.from_numpy(o.astype(np.float32))[None]).argmax())
            o, r, term, trunc, _ = env.step(a)
            total += r
            done = term or trunc
        returns.append(total)
    env.close()
    return {
        "eval_return": float(np.mean(returns)),
        "updates": updates,
        "items": table.size,
        "copied_rows": adder.copied_rows,
        "appended_rows": adder.appended_rows,
    }
