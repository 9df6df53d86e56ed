"""rlreplay.reverb without a server: public names, specs and nests, selectors, rate
limiters, errors, and what importing it costs."""

from __future__ import annotations

import collections
import subprocess
import sys
import types

import numpy as np
import pytest

import rlreplay
import rlreplay.reverb as reverb
from rlreplay.errors import (
    InvalidArgumentError,
    RateLimiterTimeoutError,
    ReplayError,
    ReplayTimeoutError,
    ServerUnavailableError,
    SignatureError,
)
from rlreplay.reverb import _nest, errors, specs

Point = collections.namedtuple("Point", ["y", "x"])

# Reverb's public names, module by module (reverb/__init__.py and its modules).
PUBLIC = {
    "": [
        "Client",
        "DeadlineExceededError",
        "ReplaySample",
        "ReverbError",
        "SampleInfo",
        "Server",
        "Table",
        "TimestepDataset",
        "TrajectoryColumn",
        "TrajectoryDataset",
        "TrajectoryWriter",
        "Writer",
        "checkpointers",
        "rate_limiters",
        "selectors",
    ],
    "client": ["Client", "Writer"],
    "server": ["Server", "Table", "TableExtensionBase"],
    "item_selectors": ["Fifo", "Lifo", "MaxHeap", "MinHeap", "Prioritized", "Uniform"],
    "rate_limiters": ["MinSize", "Queue", "RateLimiter", "SampleToInsertRatio", "Stack"],
    "errors": ["DeadlineExceededError", "ReverbError"],
    "replay_sample": ["ReplaySample", "SampleInfo"],
    "reverb_types": ["TableInfo"],
    "trajectory_writer": ["TrajectoryColumn", "TrajectoryWriter", "_ColumnHistory"],
    "trajectory_dataset": ["TrajectoryDataset"],
    "timestep_dataset": ["TimestepDataset"],
    "pybind": [
        "FifoSelector",
        "HeapSelector",
        "LifoSelector",
        "PrioritizedSelector",
        "RateLimiter",
        "Sampler",
        "UniformSelector",
        "WeakCellRef",
    ],
    "checkpointers": ["DefaultCheckpointer"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_exists(module):
    mod = reverb if not module else getattr(reverb, module)
    missing = [name for name in PUBLIC[module] if not hasattr(mod, name)]
    assert not missing, f"rlreplay.reverb.{module} lacks {missing}"
    for name in getattr(mod, "__all__", []):
        assert hasattr(mod, name), f"{module}.__all__ names {name}, which is missing"


def test_selectors_is_item_selectors():
    assert reverb.selectors is reverb.item_selectors
    assert isinstance(reverb.selectors.MinHeap(), reverb.pybind.HeapSelector)
    assert not reverb.selectors.MaxHeap().min_heap


def test_install_as_reverb_registers_the_package_and_submodules():
    saved = {k: v for k, v in sys.modules.items() if k == "reverb" or k.startswith("reverb.")}
    assert not saved, "real Reverb is imported in this test process"
    try:
        reverb.install_as_reverb()
        reverb.install_as_reverb()  # twice is fine
        import reverb as installed
        from reverb import client, server

        assert installed is reverb
        assert client is reverb.client and server is reverb.server
        assert sys.modules["reverb.item_selectors"] is reverb.item_selectors
    finally:
        for k in [k for k in sys.modules if k == "reverb" or k.startswith("reverb.")]:
            del sys.modules[k]


def test_install_as_reverb_refuses_to_shadow_another_module():
    sys.modules["reverb_taken"] = types.ModuleType("reverb_taken")
    try:
        with pytest.raises(ImportError, match="already"):
            reverb.install_as_reverb("reverb_taken")
    finally:
        del sys.modules["reverb_taken"]


def test_importing_costs_nothing_heavy():
    code = (
        "import sys, rlreplay; assert 'rlreplay.reverb' not in sys.modules; "
        "import rlreplay.reverb; "
        "heavy = [m for m in ('tensorflow', 'zmq', 'torch', 'jax') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---------------------------------------------------------------- specs and nests
class FakeTFDType:
    """A TensorFlow-like dtype: only ``as_numpy_dtype``."""

    as_numpy_dtype = np.float32


class DuckSpec:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def test_tensor_spec_takes_numpy_and_tensorflow_style_dtypes():
    a = reverb.TensorSpec([2, 3], np.float32)
    b = reverb.TensorSpec((2, 3), FakeTFDType())
    assert a == b and a.shape == (2, 3) and a.dtype == np.float32
    assert a == DuckSpec((2, 3), np.float32)
    assert a != reverb.TensorSpec((2, 3), np.float64)
    assert a != reverb.TensorSpec((2, 3), np.float32, name="obs")
    assert reverb.TensorSpec([None, 3], "int64").is_compatible_with(np.zeros((7, 3), np.int64))


def test_tensor_spec_refuses_what_is_not_a_dtype():
    with pytest.raises(InvalidArgumentError, match="dtype="):
        reverb.TensorSpec((2,), object())
    with pytest.raises(InvalidArgumentError, match="shape="):
        reverb.TensorSpec(("a",), np.float32)


def test_nests_flatten_in_reverbs_order():
    nest = {"b": (1, [2, 3]), "a": Point(y=4, x=5)}
    assert _nest.flatten(nest) == [4, 5, 1, 2, 3]  # sorted keys, namedtuple field order
    assert _nest.flatten_with_path(nest)[0] == (("a", "y"), 4)
    rebuilt = _nest.unflatten_as(nest, list("vwxyz"))
    assert rebuilt == {"a": Point("v", "w"), "b": ("x", ["y", "z"])}
    with pytest.raises(ValueError, match="leaves"):
        _nest.unflatten_as(nest, [1])


def test_signature_nests_travel_as_json():
    sig = {
        "obs": Point(y=reverb.TensorSpec([2], np.uint8), x=DuckSpec((), np.float64)),
        "a": [reverb.TensorSpec([], np.int32)],
        "t": (reverb.TensorSpec([1, 1], "bool"),),
    }
    back = specs.nest_from_json(specs.nest_to_json(sig))
    assert type(back["obs"]) is Point and isinstance(back["t"], tuple)
    assert back["obs"].x == reverb.TensorSpec((), np.float64)
    assert [s.dtype for s in specs.check_signature(back)] == [np.int32, np.uint8, np.float64, bool]


def test_a_signature_leaf_that_is_not_a_spec_is_refused():
    with pytest.raises(SignatureError, match=r"\('b',\)"):
        specs.check_signature({"a": reverb.TensorSpec([], np.int32), "b": 3})
    with pytest.raises(ValueError):
        reverb.Table(
            "t",
            reverb.selectors.Fifo(),
            reverb.selectors.Fifo(),
            10,
            reverb.rate_limiters.MinSize(1),
            signature={"x": "float32"},
        )


# ---------------------------------------------------------------- selectors, limiters
def test_selectors_validate_and_describe_themselves():
    assert reverb.selectors.Prioritized(0.6).options() == {
        "prioritized": {"priority_exponent": 0.6}
    }
    for bad in (-1.0, float("nan"), "1"):
        with pytest.raises(InvalidArgumentError, match="priority_exponent"):
            reverb.selectors.Prioritized(bad)
    with pytest.raises(InvalidArgumentError, match="sampler="):
        reverb.Table(
            "t", rlreplay.Uniform(), reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1)
        )


@pytest.mark.parametrize(
    ("spi", "min_size", "buffer", "ok"),
    [
        (5, 10, 4, False),
        (0.5, 10, 0.9, False),
        (0.5, 10, 1.1, True),
        (5, 10, (8, 12), False),
        (1, 10, (5, 9), True),
        (1, 10, (11, 15), False),
        (1, 0, (-100, 100), False),
        (1, 10, (7, 12), True),
        (0, 10, 100, False),
        (-1, 10, 100, False),
    ],
)
def test_sample_to_insert_ratio_validates_as_reverb(spi, min_size, buffer, ok):
    if ok:
        limiter = reverb.rate_limiters.SampleToInsertRatio(spi, min_size, buffer)
        assert limiter.build().min_size_to_sample == min_size
    else:
        with pytest.raises(ValueError):
            reverb.rate_limiters.SampleToInsertRatio(spi, min_size, buffer)


def test_other_limiters_validate():
    for bad in (0, -1):
        with pytest.raises(ValueError, match="min_size_to_sample"):
            reverb.rate_limiters.MinSize(bad)
    q = reverb.rate_limiters.Queue(5)
    assert (q.min_diff, q.max_diff, q.min_size_to_sample) == (0.0, 5.0, 1)
    with pytest.raises(ValueError, match="min_diff"):
        reverb.rate_limiters.RateLimiter(1.0, 1, 5.0, 0.0)


def test_table_arguments_are_checked():
    fifo, limiter = reverb.selectors.Fifo(), reverb.rate_limiters.MinSize(1)
    with pytest.raises(ValueError, match="name"):
        reverb.Table("", fifo, fifo, 10, limiter)
    with pytest.raises(ValueError, match="max_size"):
        reverb.Table("t", fifo, fifo, 0, limiter)
    with pytest.raises(ValueError, match="extensions"):
        reverb.Table("t", fifo, fifo, 10, limiter, extensions=[object()])
    with pytest.raises(ValueError, match="rate_limiter"):
        reverb.Table("t", fifo, fifo, 10, rlreplay.MinSize(1))


def test_table_info_and_replace():
    table = reverb.Table(
        "t",
        reverb.selectors.Prioritized(0.8),
        reverb.selectors.MinHeap(),
        100,
        reverb.rate_limiters.MinSize(2),
        max_times_sampled=3,
    )
    info = table.info
    assert (info.name, info.max_size, info.current_size, info.max_times_sampled) == ("t", 100, 0, 3)
    assert info.sampler_options.HasField("prioritized")
    assert info.sampler_options.prioritized.priority_exponent == 0.8
    assert info.remover_options.heap.min_heap and not info.remover_options.HasField("fifo")
    assert info.rate_limiter_info.min_size_to_sample == 2 and info.signature is None
    assert not table.can_sample(1) and table.can_insert(1)
    new = table.replace(rate_limiter=reverb.rate_limiters.MinSize(1), max_size=7)
    assert new.info.rate_limiter_info.min_size_to_sample == 1 and new.info.max_size == 7
    assert new.name == "t" and new.info.max_times_sampled == 3


def test_server_needs_unique_tables():
    fifo, limiter = reverb.selectors.Fifo(), reverb.rate_limiters.MinSize(1)
    with pytest.raises(ValueError):
        reverb.Server(tables=[])
    with pytest.raises(ValueError, match="same name"):
        reverb.Server(
            [reverb.Table("a", fifo, fifo, 5, limiter), reverb.Table("a", fifo, fifo, 5, limiter)]
        )


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (errors.ReverbError, ReplayError),
        (errors.DeadlineExceededError, ReplayTimeoutError),
        (errors.RateLimiterTimeoutError, RateLimiterTimeoutError),
        (errors.RateLimiterTimeoutError, errors.DeadlineExceededError),
        (errors.UnavailableError, ServerUnavailableError),
        (errors.InvalidArgumentError, InvalidArgumentError),
        (errors.InvalidArgumentError, ValueError),
        (errors.SignatureError, SignatureError),
    ],
)
def test_each_reverb_error_is_also_rlreplays(ours, theirs):
    assert issubclass(ours, theirs) and issubclass(ours, errors.ReverbError)


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (RateLimiterTimeoutError("x"), errors.RateLimiterTimeoutError),
        (ServerUnavailableError("x"), errors.UnavailableError),
        (ReplayTimeoutError("x"), errors.DeadlineExceededError),
        (SignatureError("x"), errors.SignatureError),
        (InvalidArgumentError("x"), errors.InvalidArgumentError),
    ],
)
def test_rlreplay_errors_come_back_under_reverbs_names(raised, expected):
    new = errors.translate(raised)
    assert type(new) is expected and str(new) == "x" and new.__cause__ is raised
    assert errors.translate(ValueError("y")).__class__ is ValueError


def test_trajectory_column_checks_its_references():
    ref = reverb.pybind.WeakCellRef(np.arange(6).reshape(2, 3))
    col = reverb.TrajectoryColumn([ref, ref])
    assert col.shape == (2, 2, 3) and len(col) == 2 and col.numpy().shape == (2, 2, 3)
    assert reverb.TrajectoryColumn([ref], squeeze=True).shape == (2, 3)
    assert col[0].is_squeezed and col[:1].shape == (1, 2, 3)
    with pytest.raises(ValueError, match="exactly one"):
        reverb.TrajectoryColumn([ref, ref], squeeze=True)
    with pytest.raises(ValueError, match="cannot contain any None"):
        reverb.TrajectoryColumn([ref, None])
    with pytest.raises(TypeError):
        col["a"]
