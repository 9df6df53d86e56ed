"""Every compiled kernel leaves its arguments' reference counts as they were, on every
error path and on success.

A buffer acquired and not released on an error path keeps a reference on the array (and
its memory) for the life of the process, one per failing call. The calls probed are the
ones the library itself makes (recorded from a small workload), then each argument in
turn is replaced by each bad value of ``BAD_VALUES`` (wrong dtype, wrong shape, not
contiguous, not an array, out-of-range contents, ...), and the call repeated: the
reference count of every object passed (arrays, the lists and tuples holding them) must
not grow. Skipped when the kernels are not built or are turned off.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rlreplay import NStepTransitionAdder, Prioritized, Table, Uniform
from rlreplay.core import _compiled
from rlreplay.core.selectors.sum_tree import KaryTree

KERNELS = {name: _compiled.load_kernel(name) for name in _compiled.KERNELS}
if any(module is None for module in KERNELS.values()):
    pytest.skip("the compiled kernels are not built or are disabled", allow_module_level=True)

REPEATS = 50
HAVE_SB3 = importlib.util.find_spec("stable_baselines3") is not None
SB3_KERNEL = "rlreplay.integrations._sb3_transitions"


def _functions(module) -> list[str]:
    return sorted(
        name
        for name in dir(module)
        if not name.startswith("_")
        and callable(getattr(module, name))
        and not isinstance(getattr(module, name), type)
    )


def _copy(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """An independent copy of a call's arguments: arrays keep their dtype, shape and
    layout, and an array passed twice (a min tree over a sum tree's leaves) is copied once."""
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, np.ndarray):
        out: Any = value.copy()
    elif isinstance(value, (list, tuple)):
        out = type(value)(_copy(v, memo) for v in value)
    elif isinstance(value, dict):
        out = {k: _copy(v, memo) for k, v in value.items()}
    else:
        return value
    memo[id(value)] = out
    return out


def _workload() -> None:
    """Calls every kernel function the library uses, the way it uses it."""
    prio = Table(
        "p",
        signature={"obs": ((3,), "float32"), "r": "float32"},
        max_size=32,
        sampler=Prioritized(0.6),
        seed=1,
    )
    for i in range(40):  # one-row inserts, past the capacity: evictions
        prio.insert({"obs": np.full(3, i, np.float32), "r": float(i)}, 1.0 + i)
    keys = prio.insert(
        {"obs": np.zeros((24, 3), np.float32), "r": np.zeros(24, np.float32)},
        priorities=np.ones(24),
    )
    batch = prio.sample(16)
    prio.update_priorities(batch.info.keys, np.full(16, 2.0))
    prio.delete(keys[-4:])
    uni = Table("u", signature={"x": "int64"}, max_size=32, sampler=Uniform(), seed=1)
    keys = uni.insert({"x": np.arange(20)})
    uni.sample(8)
    uni.delete(keys[:5])
    sig = NStepTransitionAdder.signature(obs=((2,), "float32"), action="int64")
    table = Table("n", signature=sig, capacity=4096, layout=NStepTransitionAdder.layout(sig, 2))
    adder = NStepTransitionAdder(table, n=2, discount=0.9, num_envs=4)
    adder.reset(np.zeros((4, 2), np.float32))
    for t in range(12):
        done = np.arange(4) == t % 5
        adder.add(
            np.zeros(4, np.int64),
            np.ones(4, np.float32),
            np.full((4, 2), t, np.float32),
            done,
            np.zeros(4, bool),
        )
    adder.flush()
    _sb3_workload()
    sums, mins = KaryTree(40, "sum"), KaryTree(40, "min")  # what the selectors call alone
    mins.set(np.array([1, 2]), np.array([1.0, 2.0]))
    mins = KaryTree(40, "min", leaves=sums.levels[0])
    sums.set(np.array([1, 2]), np.array([1.0, 2.0]), mins)  # set_sum with its min tree


def _sb3_workload() -> None:
    """The SB3 buffers' sampling (its kernel is not used without Stable-Baselines3)."""
    if not HAVE_SB3:
        return
    from gymnasium import spaces

    from rlreplay.integrations.sb3 import ReplayBuffer

    box = spaces.Box(-1.0, 1.0, (3,), np.float32)
    buffer = ReplayBuffer(8, box, spaces.Discrete(2), "cpu", n_envs=2)
    obs = np.zeros((2, 3), np.float32)
    for t in range(7):
        next_obs = np.full((2, 3), t + 1, np.float32)
        done = np.array([t % 3 == 2, False])
        buffer.add(obs, next_obs, np.array([0, 1]), np.ones(2, np.float32), done, [{}, {}])
        obs = np.where(done[:, None], -next_obs, next_obs)  # an episode's end: a reset obs
    buffer.sample(5)


@pytest.fixture(scope="module")
def recorded() -> dict[tuple[str, str], dict[int, tuple]]:
    """The first call the library makes to each kernel function with each number of
    arguments (optional ones given or not): (module, name) -> {count: args}."""
    calls: dict[tuple[str, str], dict[int, tuple]] = {}
    originals: list[tuple[Any, str, Callable]] = []

    def wrap(module, name: str) -> Callable:
        fn = getattr(module, name)

        def recording(*args):
            calls.setdefault((module.__name__, name), {}).setdefault(len(args), _copy(args))
            return fn(*args)

        return recording

    for module in KERNELS.values():
        for name in _functions(module):
            originals.append((module, name, getattr(module, name)))
            setattr(module, name, wrap(module, name))
    try:
        _workload()
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)
    return calls


def _bad_values(value: Any) -> dict[str, Any]:
    """Named values that should be refused in the place of ``value``."""
    out: dict[str, Any] = {
        "None": None,
        "a string": "x",
        "a list of ints": [0, 1, 2],
        "a float": 0.5,
        "a huge int": 2**70,
        "a negative int": -1,
        "a 0-d array": np.array(1.0),
        "read-only bytes": b"\x00" * 64,
    }
    if isinstance(value, np.ndarray):
        other = np.float32 if value.dtype != np.float32 else np.int64
        with np.errstate(over="ignore", invalid="ignore"):  # any values of another dtype
            out["another dtype"] = value.astype(other)
        out["two dimensions"] = np.repeat(value.reshape(1, -1), 2, axis=0)
        out["not contiguous"] = np.repeat(value, 2)[::2] if value.ndim == 1 else value.T
        out["empty"] = value[:0]
        out["one item more"] = np.concatenate([value.reshape(-1), value.reshape(-1)[:1]])
        read_only = value.copy()
        read_only.flags.writeable = False
        out["read-only"] = read_only
        if value.dtype.kind in "iu" and value.size:
            if value.dtype.kind == "i":
                out["negative contents"] = np.full_like(value, -1)
            out["too large contents"] = np.full_like(value, np.iinfo(value.dtype).max)
        if value.dtype.kind == "f" and value.size:
            out["nan contents"] = np.full_like(value, np.nan)
    if isinstance(value, (list, tuple)) and value:
        out["one element fewer"] = type(value)(value[:-1])
        out["an element of another kind"] = type(value)([*value[:-1], "x"])
        out["empty sequence"] = type(value)()
    return out


def _objects(value: Any) -> list[Any]:
    """``value`` and every object it holds (elements of tuples, lists and dicts)."""
    found = [value]
    if isinstance(value, (list, tuple)):
        for v in value:
            found += _objects(v)
    elif isinstance(value, dict):
        for v in value.values():
            found += _objects(v)
    return found


def _counts(objects: list[Any]) -> list[int]:
    return [sys.getrefcount(o) for o in objects]


def _repeat(fn: Callable, args: tuple) -> None:
    for _ in range(REPEATS):
        with contextlib.suppress(TypeError, ValueError, IndexError, OverflowError, BufferError):
            fn(*args)


def _probe(fn: Callable, args: tuple) -> list[str]:
    """Each argument replaced by each bad value: the leaks found, described."""
    leaks = []
    cases = {"the call as made": None}
    cases.update(
        {
            f"argument {i} {kind}": (i, bad)
            for i, value in enumerate(args)
            for kind, bad in _bad_values(value).items()
        }
    )
    for case, change in cases.items():
        call = _copy(args)
        if change is not None:
            call = (*call[: change[0]], change[1], *call[change[0] + 1 :])
        objects = [o for o in _objects(call) if not isinstance(o, (int, float, str, type(None)))]
        _repeat(fn, call)  # caches, interned values: settled before counting
        before = _counts(objects)
        _repeat(fn, call)
        after = _counts(objects)
        grown = [(type(o).__name__, a - b) for o, b, a in zip(objects, before, after) if a != b]
        if grown:
            leaks.append(f"{case}: {grown}")
    return leaks


def test_the_workload_calls_every_kernel_function(recorded):
    every = {(m, n) for m, module in KERNELS.items() for n in _functions(module)}
    if not HAVE_SB3:
        every = {(m, n) for m, n in every if m != SB3_KERNEL}
    assert every - set(recorded) == set()


@pytest.mark.parametrize(
    "module, name",
    [(m, n) for m, module in KERNELS.items() for n in _functions(module)],
)
def test_no_call_of_a_kernel_function_leaves_a_reference_behind(recorded, module, name):
    if module == SB3_KERNEL and not HAVE_SB3:
        pytest.skip("Stable-Baselines3 is not installed: its buffers are not sampled")
    fn = getattr(KERNELS[module], name)
    for args in recorded[(module, name)].values():
        assert _probe(fn, args) == []


def _tree(leaves: int = 40) -> list[np.ndarray]:
    return KaryTree(leaves, "sum", use_kernel=True).levels


LEAF_WRITER_CALLS = {
    "set_many": (np.array([1, 2], np.int64), np.array([1.0, 2.0]), 0.5),
}


@pytest.mark.parametrize("method", LEAF_WRITER_CALLS)
def test_no_call_of_a_leaf_writer_leaves_a_reference_behind(method):
    sums, mins = _tree(), _tree()
    mins[0] = sums[0]  # a min tree over the same leaves
    writer = KERNELS["rlreplay.core.selectors._sumtree"].LeafWriter(sums, mins)
    assert _probe(getattr(writer, method), LEAF_WRITER_CALLS[method]) == []


def test_building_a_leaf_writer_from_bad_trees_leaves_no_reference_behind():
    sums, mins = _tree(), _tree()
    mins[0] = sums[0]
    build = KERNELS["rlreplay.core.selectors._sumtree"].LeafWriter
    assert _probe(build, (sums, mins)) == []
    assert _probe(build, (sums, _tree())) == []  # a min tree over other leaves
