"""Checks of :func:`rlreplay.distributed.ray.start_shards` arguments, before anything starts."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from rlreplay.distributed.sharded_client import ShardedClient
from rlreplay.errors import InvalidArgumentError, describe
from rlreplay.net.client.client import Client

# Arguments start_shards gives each shard's Server itself, and what to use instead.
_SERVER_SET = {
    "tables": "give start_shards(tables=...)",
    "bind": "give start_shards(bind=...)",
    "checkpoint_dir": "give start_shards(checkpoint_dir=...): each shard gets its own folder",
}
# The sharded client's own arguments: start_shards knows every shard's address.
_CLIENT_SET = {"addresses": "start_shards passes the shards' addresses itself"}


def server_arguments() -> dict[str, str | None]:
    """Each :class:`~rlreplay.Server` argument ``server_kwargs`` may name (None), or what to use."""
    from rlreplay.net.server.server import Server  # the driver needs only the client otherwise

    names = dict.fromkeys(inspect.signature(Server).parameters)
    return {**names, **_SERVER_SET}


def client_arguments() -> dict[str, str | None]:
    """Each client argument ``client_kwargs`` may name (None), or what to do instead."""
    names = {}
    for target in (ShardedClient, Client):
        for name, parameter in inspect.signature(target).parameters.items():
            if parameter.kind is not inspect.Parameter.VAR_KEYWORD:
                names[name] = None
    names.pop("address", None)
    return {**names, **_CLIENT_SET}


def checked_kwargs(name: str, kwargs: Any, allowed: dict[str, str | None]) -> dict:
    """``kwargs`` as a dict, refused if it names an argument the target does not take.

    Raises:
        InvalidArgumentError: naming the key and the arguments that may be given.
    """
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise InvalidArgumentError(
            f"{name}={describe(kwargs)} must be a mapping of argument names to values"
        )
    for key in kwargs:
        if key not in allowed:
            choices = sorted(k for k, v in allowed.items() if v is None)
            raise InvalidArgumentError(f"{name} names {key!r}, which is not one of {choices}")
        if allowed[key] is not None:
            raise InvalidArgumentError(f"{name} names {key!r}: {allowed[key]}")
    return dict(kwargs)


def checked_resources(resources: Any) -> dict[str, float]:
    """Each shard's custom resources as ``{name: amount}``.

    Raises:
        InvalidArgumentError: for anything but names to amounts >= 0, or CPUs and GPUs.
    """
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise InvalidArgumentError(
            f"resources={describe(resources)} must map custom resource names to amounts "
            "each shard reserves, e.g. {'replay': 1}"
        )
    for key, value in resources.items():
        if key in ("CPU", "GPU"):
            raise InvalidArgumentError(
                f"resources names {key!r}; give each shard's CPUs with num_cpus (a replay "
                "server uses no GPU), and custom resources such as 'replay' here"
            )
        if (not isinstance(key, str) or not key or isinstance(value, bool)
                or not isinstance(value, (int, float)) or not value >= 0):
            raise InvalidArgumentError(
                f"resources={describe(dict(resources))} must map names to amounts >= 0; "
                f"{key!r}: {describe(value)} is not"
            )
    return {k: float(v) for k, v in resources.items()}


def shortfall(nodes: list[dict], bundle: dict[str, float], num_shards: int,
              strategy: str) -> str:
    """What the cluster lacks for the shards' bundles (``""`` when it was busy, not too small)."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    problems = []
    for name, amount in bundle.items():
        if amount <= 0:
            continue
        fits = [r.get(name, 0.0) for r in alive if r.get(name, 0.0) >= amount]
        total = sum(r.get(name, 0.0) for r in alive)
        if not fits:
            problems.append(
                f"no node has {amount:g} {name!r}" + (
                    f" (declare it with `ray start --resources='{{\"{name}\": N}}'`, or "
                    "ray.init(resources=...) for a local Ray)"
                    if name not in ("CPU", "GPU", "memory") else "")
            )
        elif total < amount * num_shards:
            problems.append(
                f"the shards need {amount * num_shards:g} {name!r} in all and the cluster "
                f"has {total:g}"
            )
        elif strategy == "STRICT_SPREAD" and len(fits) < num_shards:
            problems.append(
                f"STRICT_SPREAD needs {num_shards} nodes with {amount:g} {name!r} each "
                f"and the cluster has {len(fits)}"
            )
    if not problems:
        return ""
    return (
        "; " + "; ".join(problems) + ": give less (num_cpus, resources), fewer shards, or "
        "add nodes"
    )
