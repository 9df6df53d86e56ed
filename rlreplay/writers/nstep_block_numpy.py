"""The numpy settle of an n-step adder's block of calls: the compiled plan's twin.

:class:`~rlreplay.writers.nstep_blocks.NStepBlock` settles its recorded calls with the
compiled plan (``rlreplay/writers/_blocks.c``) when it is built, and with :func:`settle`
otherwise (no compiler, or ``RLREPLAY_NO_EXTENSION=1``). Both give the writer exactly
what the per-call path gives it; here every step of the bookkeeping is a vectorised
numpy operation over the block's ``[calls, num_envs]`` grid:

* which calls step, which episodes end (in ``next_step`` mode the step after an end is
  ignored and starts the next episode), each step's index in its episode, and where each
  environment's rows go in the block's scratch rows (held rows first);
* every piece the per-call path cuts (by call, ended episodes before full chunks, by
  environment), its context rows, n-step returns, discounts and items;
* the episodes' state after the block.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def settle(block: Any, K: int) -> None:
    """Settle ``K`` recorded calls of ``block`` (an :class:`NStepBlock`) in numpy alone:
    what :meth:`NStepBlock.settle` does with the compiled plan, same results."""
    a = block.adder
    episodes = a._episodes
    rows = a._rows
    pieces = a._pieces
    E, W = a.num_envs, block.width
    pad, n, lag, chunk, span, stack = a.pad, a.n, a.lag, a.chunk_length, a.span, a.stack
    # Episodes that end: done, unless the step is the ignored one after an end.
    done = block.terminated[:K] | block.truncated[:K]
    if block.same_step:
        ended = done
    else:
        ended = done.copy()
        ended[0] &= ~episodes.awaiting_reset
        for k in range(1, K):
            ended[k] &= ~ended[k - 1]
    envs = np.arange(E, dtype=np.int64)

    # -- which calls step, where each env's rows go in the scratch buffer
    aw0 = episodes.awaiting_reset.copy()
    if block.same_step:
        stepping = np.ones((K, E), dtype=bool)
        restart = np.zeros((K + 1, E), dtype=bool)  # a new episode from this call on
        restart[1:] = ended
        advance = 1 + ended * (1 + pad)
    else:
        ignored = np.empty((K, E), dtype=bool)
        ignored[0] = aw0
        ignored[1:] = ended[:-1]
        stepping = ~ignored
        restart = np.zeros((K + 1, E), dtype=bool)
        restart[:K] = ignored
        advance = stepping.astype(np.int64) + ended + ignored * pad
    steps0 = episodes.steps.copy()
    base0 = rows.base.copy()
    # Stream position (scratch row) of each env's current row before the block: its
    # held rows start at position 0 (episode row base0); an env waiting for its
    # reset starts its next episode at 0.
    cur0 = np.where(aw0, 0, pad + steps0 - base0)
    ends_at = np.cumsum(advance, axis=0)
    cur = cur0 + ends_at - advance  # [K, E] position of the current row at call k
    cur_end = cur0 + ends_at[-1]
    # Steps taken before each call in its episode: steps before the block for the
    # episode open at its start, counted from the last restart otherwise.
    taken = np.zeros((K + 1, E), dtype=np.int64)
    np.cumsum(stepping, axis=0, out=taken[1:])
    seg = np.cumsum(restart, axis=0)  # restarts so far ([K + 1, E])
    last = np.where(restart, np.arange(K + 1)[:, None], -1)
    np.maximum.accumulate(last, axis=0, out=last)
    offset = np.where(last >= 0, taken[np.maximum(last, 0), envs], -steps0)
    before = taken - offset  # [K + 1, E]: steps of the episode before call k
    s = before[:K]
    first_ep = seg == 0  # still the episode open at the block's start
    a0 = np.where(first_ep, episodes.appended, 0)  # rows handed over before the block
    ni0 = np.where(first_ep, a._next_item, 0)  # its next item anchor
    serial = episodes.serial + seg
    start = np.where(first_ep, base0, 0)  # its first held row

    # -- the scratch rows: held rows, then each call's step and observations
    flat = block._flat
    held = int((cur0 + 1).max())
    for p in block.field_paths:
        scratch = block.scratch[p]
        scratch[:, :held] = rows.arrays[p][:, :held]
        scratch[:, held : int(cur_end.max()) + 2] = 0
        if aw0.any():
            scratch[aw0, :held] = 0
    for p in block.obs_paths:
        block.scratch[p][:, :held] = rows.arrays[p][:, :held]
    row0 = envs * W
    pos = cur + row0  # flat positions of the current rows
    if stepping.all():
        at, step_k, step_e = pos.reshape(-1), slice(None), slice(None)
        for p in block.field_paths:
            flat[p][at] = block.fields[p][:K].reshape(K * E, *flat[p].shape[1:])
        for p in block.obs_paths:
            flat[p][at + 1] = block.obs[p][:K].reshape(K * E, *flat[p].shape[1:])
    else:
        step_k, step_e = np.nonzero(stepping)
        at = pos[step_k, step_e]
        for p in block.field_paths:
            flat[p][at] = block.fields[p][step_k, step_e]
        for p in block.obs_paths:
            flat[p][at + 1] = block.obs[p][step_k, step_e]
    # A new episode's first observation fills its padding rows and first row.
    if block.same_step:
        rk, re = np.nonzero(ended)
        if len(rk):
            first_at = pos[rk, re] + 2
            for p in block.obs_paths:
                values = block.reset_obs[p][rk, re]
                for j in range(pad + 1):
                    flat[p][first_at + j] = values
    else:
        rk, re = np.nonzero(ignored)
        if len(rk):
            first_at = pos[rk, re]
            for p in block.obs_paths:
                values = block.obs[p][rk, re]
                for j in range(pad + 1):
                    flat[p][first_at + j] = values

    # -- the pieces: ended episodes and full chunks, by call, ended first, by env
    ek, ee = np.nonzero(ended)
    s_e = s[ek, ee]
    a0_e = a0[ek, ee]
    ready_e = pad + np.maximum(0, s_e - lag + 1)  # complete rows before the last step
    lo_e = a0_e + chunk * ((ready_e - a0_e) // chunk)
    hi_e = pad + s_e + 2
    after = s + 1  # steps after the call's step
    ready = pad + np.maximum(0, after - lag + 1)
    grown = ready - a0[:K]
    full = stepping & ~ended & (grown >= chunk) & (grown % chunk == 0)
    ck, ce = np.nonzero(full)
    hi_c = ready[ck, ce]
    lo_c = hi_c - chunk
    key = np.concatenate((ek * (2 * E) + ee, ck * (2 * E) + E + ce))
    order = np.argsort(key, kind="stable")
    pk = np.concatenate((ek, ck))[order]
    pe = np.concatenate((ee, ce))[order]
    lo = np.concatenate((lo_e, lo_c))[order]
    hi = np.concatenate((hi_e, hi_c))[order]
    is_end = np.zeros(len(key), dtype=bool)
    is_end[: len(ek)] = True
    is_end = is_end[order]
    total = np.concatenate((s_e + 1, after[ck, ce]))[order]  # episode steps so far
    z = (cur - pad - s)[pk, pe] + row0[pe]  # flat position of episode row 0
    ni = ni0[pk, pe]
    first_item = np.maximum(ni, lo - n - stack + 1)
    stop = np.where(is_end, total, np.maximum(first_item, hi - n - stack + 1))
    term = block.terminated[:K][pk, pe]
    stream_serial = serial[pk, pe]
    if len(pk):
        _stage(block, pe, stream_serial, z, lo, hi, total, is_end, term, first_item, stop)

    # -- the episodes after the block
    waiting = ended[-1] if not block.same_step else block._no_ends
    steps_end = before[K]
    a0_end = a0[K]
    ready_end = pad + np.maximum(0, steps_end - lag + 1)
    appended_end = a0_end + chunk * ((ready_end - a0_end) // chunk)
    cut = appended_end > a0_end
    ni_end = np.where(cut, np.maximum(ni0[K], appended_end - n - stack + 1), ni0[K])
    base_end = np.where(cut, np.maximum(start[K], appended_end - (span - 1)), start[K])
    z_end = cur_end - pad - steps_end
    held_end = pad + steps_end + 1 - base_end
    if waiting.any():
        steps_end[waiting] = 0
        appended_end[waiting] = 0
        ni_end[waiting] = 0
        base_end[waiting] = 0
        held_end[waiting] = 0
    cap = rows.capacity
    j = np.arange(cap)
    src = row0[:, None] + np.minimum(z_end + base_end, W - cap)[:, None] + j
    beyond = j >= held_end[:, None]
    for p, arr in rows.arrays.items():
        np.take(flat[p], src, axis=0, out=arr)
        if p in block.fields:
            arr[beyond] = 0
    episodes.active[:] = ~waiting
    episodes.awaiting_reset[:] = waiting
    episodes.steps[:] = steps_end
    episodes.appended[:] = appended_end
    episodes.serial[:] = serial[K]
    episodes.waiting = np.flatnonzero(waiting)
    episodes.episodes += len(ek)
    rows.base[:] = base_end
    a._next_item[:] = ni_end
    pieces._countdown = 0


def _stage(
    block: Any,
    env: np.ndarray,
    serial: np.ndarray,
    z: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    total: np.ndarray,
    ended: np.ndarray,
    terminated: np.ndarray,
    first_item: np.ndarray,
    stop: np.ndarray,
) -> None:
    """Stage the pieces (in order): rows ``[lo, hi)`` of the episode whose row 0 is
    at flat scratch position ``z``, with context rows where a piece does not continue
    the last piece's stream, and items ``first_item .. stop - 1``."""
    a = block.adder
    pieces = a._pieces
    n, stack = a.n, a.stack
    has = hi > lo
    with_rows = np.flatnonzero(has)
    first = lo.copy()
    switch = np.zeros(len(env), dtype=bool)
    if len(with_rows):
        e, s = env[with_rows], serial[with_rows]
        last_e, last_s = pieces.last_stream or (-1, -1)
        prev_e = np.concatenate(([last_e], e[:-1]))
        prev_s = np.concatenate(([last_s], s[:-1]))
        sw = (e != prev_e) | (s != prev_s)
        switch[with_rows] = sw
        lw = lo[with_rows]
        first[with_rows] = np.where(sw, np.maximum(0, lw - (a.span - 1)), lw)
        pieces.last_stream = (int(e[-1]), int(s[-1]))
    counts = np.where(has, hi - first, 0)
    rows_total = int(counts.sum())
    pieces.copied_rows += int((lo - first).sum())
    pieces.appended_rows += rows_total
    ends = np.cumsum(counts)
    if rows_total:
        out = a._out.reserve(rows_total)
        row = np.arange(rows_total, dtype=np.int64) + np.repeat(first - (ends - counts), counts)
        pos = row + np.repeat(z, counts)
        for p, f in block._flat.items():
            np.take(f, pos, axis=0, out=out[p])
        _columns(
            block,
            row,
            pos,
            np.repeat(total, counts),
            np.repeat(ended, counts),
            np.repeat(terminated, counts),
            out,
        )
    items = stop - first_item
    count = int(items.sum())
    iends = np.cumsum(items)
    t = np.arange(count, dtype=np.int64) + np.repeat(first_item - (iends - items), items)
    left = np.repeat(total, items) - t
    extent = np.where(np.repeat(ended, items), np.minimum(left, n), n) + stack
    rel = t - np.repeat(hi, items)
    tables = list(zip(a.tables, a._spans))
    batch = a._out.batch
    for c, sw, i0, i1 in zip(
        counts.tolist(), switch.tolist(), (iends - items).tolist(), iends.tolist()
    ):
        jobs = []
        if i1 > i0:
            starts, ext = rel[i0:i1], extent[i0:i1]
            jobs = [(table, span, starts, ext) for table, span in tables]
        if c or jobs:
            batch.add(c, sw, jobs)


def _columns(
    block: Any,
    row: np.ndarray,
    pos: np.ndarray,
    total: np.ndarray,
    ended: np.ndarray,
    terminated: np.ndarray,
    out: dict[str, np.ndarray],
) -> None:
    """The n-step return and discount of every staged row (see
    :class:`~rlreplay.writers.nstep.NStepTransitionAdder`): episode row ``row[k]`` of
    an episode of ``total[k]`` steps so far, its reward at flat position ``pos[k]``."""
    a = block.adder
    n, pad = a.n, a.pad
    step = row - pad  # < 0: padding rows, no item is anchored there
    left = total - step  # steps from this row's to the episode's end (so far)
    reward = block._flat["reward"]
    last = len(reward) - 1
    # An open episode's complete rows have n rewards; an ended one's last rows fewer
    # (rewards past the final row count as zero, as in the per-piece cut).
    # [rows, n] windows of float64 rewards times discount powers: the per-piece cut's
    # product, so that the float32 returns round the same way.
    window = np.minimum(pos[:, None] + np.arange(n), last)
    r = reward[window].astype(np.float64)
    r[left[:, None] <= np.arange(n)] = 0.0
    ret = r @ a._weights
    padding = step < 0
    ret[padding] = 0.0
    out["n_step_return"][:] = ret
    disc = np.where(ended, a._tail[np.clip(left, 0, n)], a._powers[n])
    # No bootstrapping from a terminal state: the last n steps of a terminated episode.
    disc[terminated & (left <= n)] = 0.0
    disc[padding] = 0.0
    out["discount"][:] = disc
