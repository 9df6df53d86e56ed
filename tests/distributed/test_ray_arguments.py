"""``start_shards`` refuses mistaken arguments in the driver, before anything starts on
the cluster (these run without Ray: nothing is started), and says what a cluster lacks
when the shards cannot be placed."""

from __future__ import annotations

import functools
import sys

import pytest

from rlreplay.distributed.ray import start_shards
from rlreplay.distributed.ray_checks import shortfall
from rlreplay.errors import InvalidArgumentError

CONFIG = {"table": [{"name": "t", "signature": {"x": "int64"}, "max_size": 10}]}


def _tables(index: int, seed: int) -> list:
    return []


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """Ray unimportable: each refusal happens before start_shards would import it."""
    monkeypatch.setitem(sys.modules, "ray", None)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start_timeout": -1}, r"start_timeout=-1 must be a number of seconds > 0"),
        ({"start_timeout": 0}, r"start_timeout=0 must be"),
        ({"start_timeout": True}, r"start_timeout=True must be"),
        ({"start_timeout": "60"}, r"start_timeout='60' must be"),
        ({"resources": ["replay"]}, r"resources=\['replay'\] must map custom resource names"),
        ({"resources": {"replay": "1"}}, r"'replay': '1' is not"),
        ({"resources": {"replay": True}}, r"'replay': True is not"),
        ({"resources": {"replay": -1}}, r"'replay': -1 is not"),
        ({"resources": {1: 1}}, r"1: 1 is not"),
        ({"resources": {"CPU": 1}}, r"resources names 'CPU'; give each shard's CPUs with "
                                     r"num_cpus"),
        ({"resources": {"GPU": 1}}, r"resources names 'GPU'"),
        ({"server_kwargs": {"prot": 5}}, r"server_kwargs names 'prot', which is not one of "
                                         r"\[.*'port'"),
        ({"server_kwargs": {"bind": "0.0.0.0"}}, r"server_kwargs names 'bind': give "
                                                 r"start_shards\(bind=\.\.\.\)"),
        ({"server_kwargs": {"checkpoint_dir": "ckpt"}},
         r"give start_shards\(checkpoint_dir=\.\.\.\): each shard gets its own folder"),
        ({"server_kwargs": ["port", 5]}, r"server_kwargs=\['port', 5\] must be a mapping"),
        ({"client_kwargs": {"cal_timeout": 5}},
         r"client_kwargs names 'cal_timeout', which is not one of \[.*'call_timeout'"),
        ({"client_kwargs": {"addresses": ["a:1"]}}, r"client_kwargs names 'addresses'"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_mistaken_arguments_are_refused_before_anything_starts(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        start_shards(CONFIG, 2, **kwargs)


def test_a_tables_callable_must_return_each_shards_builder():
    with pytest.raises(InvalidArgumentError, match=r"tables\(0\) returned \[\]; a callable "
                                                   r"tables must return"):
        start_shards(lambda i: [], 2)  # the tables themselves, not a builder


def test_arguments_that_pass_the_checks_reach_ray():
    # Right arguments get as far as importing Ray (missing here): nothing refused them.
    with pytest.raises(ImportError, match=r"rlreplay\[ray\]"):
        start_shards(
            lambda i: functools.partial(_tables, i, seed=i), 2, num_cpus=0.5,
            resources={"replay": 1}, start_timeout=5, server_kwargs={"port": None},
            client_kwargs={"call_timeout": 5.0, "on_shard_down": "skip"},
        )


NODE = {"Alive": True, "Resources": {"CPU": 2.0, "memory": 1e9}}
REPLAY_NODE = {"Alive": True, "Resources": {"CPU": 1.0, "replay": 1.0}}
DEAD = {"Alive": False, "Resources": {"CPU": 64.0, "replay": 8.0}}


@pytest.mark.parametrize(
    ("nodes", "bundle", "shards", "strategy", "says"),
    [
        ([NODE], {"CPU": 1.0}, 4, "SPREAD", "the shards need 4 'CPU' in all and the cluster "
                                            "has 2"),
        ([NODE, DEAD], {"CPU": 0.5, "replay": 1.0}, 2, "SPREAD",
         "no node has 1 'replay' (declare it with `ray start --resources='{\"replay\": N}'`"),
        ([NODE], {"CPU": 4.0}, 1, "PACK", "no node has 4 'CPU':"),
        ([NODE, REPLAY_NODE], {"CPU": 0.5, "replay": 1.0}, 2, "STRICT_SPREAD",
         "the shards need 2 'replay' in all and the cluster has 1"),
        ([NODE], {"CPU": 0.5}, 2, "STRICT_SPREAD",
         "STRICT_SPREAD needs 2 nodes with 0.5 'CPU' each and the cluster has 1"),
    ],
)
def test_a_placement_that_cannot_happen_names_what_the_cluster_lacks(
    nodes, bundle, shards, strategy, says
):
    text = shortfall(nodes, bundle, shards, strategy)
    assert says in text and text.endswith("or add nodes")


def test_a_cluster_that_is_only_busy_lacks_nothing():
    assert shortfall([NODE, NODE], {"CPU": 1.0}, 4, "SPREAD") == ""
    assert shortfall([NODE], {"CPU": 0.0}, 4, "STRICT_SPREAD") == ""
