"""Build tables from a plain configuration mapping (the parsed ``tables.toml``).

Format (TOML shown; any mapping of the same shape works)::

    [[store]]                      # optional: steps shared by several tables
    name = "steps"
    capacity = 100000
    signature = { obs = { shape = [4], dtype = "float32" }, reward = "float32" }

    [[table]]
    name = "replay"
    store = "steps"                # or: signature = {...} and capacity = N
    max_size = 100000
    layout = { type = "transition", n_step = 1, next_fields = ["obs"] }  # default "rows"
    sampler = { type = "Prioritized", priority_exponent = 0.6 }          # default Uniform
    remover = { type = "Fifo" }                                          # default Fifo
    rate_limiter = { type = "SampleToInsertRatio", samples_per_insert = 4.0,
                     min_size_to_sample = 1000, error_buffer = 100.0 }   # default MinSize(1)
    max_times_sampled = 0
    seed = 1

    [[table]]
    name = "queue"
    kind = "queue"                 # or "stack": Table.queue / Table.stack
    size = 1000
    signature = { obs = { shape = [4], dtype = "float32" } }
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlreplay.core.layout import ItemLayout
from rlreplay.core.rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio
from rlreplay.core.selectors import selector_from_config
from rlreplay.core.specs import FieldSpec, Signature
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, describe

LIMITERS = {
    "MinSize": MinSize,
    "SampleToInsertRatio": SampleToInsertRatio,
    "Queue": Queue,
    "RateLimiter": RateLimiter,
}
TABLE_KEYS = {
    "name", "store", "signature", "capacity", "max_size", "layout", "sampler", "remover",
    "rate_limiter", "max_times_sampled", "default_priority", "on_overwrite", "seed", "kind",
    "size",
}  # fmt: skip


def _signature(spec: Any, where: str) -> Signature:
    if not isinstance(spec, Mapping):
        raise InvalidArgumentError(f"{where}.signature must be a table of fields")

    def leaf(value: Any) -> Any:
        if isinstance(value, Mapping) and set(value) <= {"shape", "dtype"} and value:
            return FieldSpec(tuple(value.get("shape", ())), value.get("dtype", "float32"))
        if isinstance(value, Mapping):
            return {k: leaf(v) for k, v in value.items()}
        return value

    return Signature({k: leaf(v) for k, v in spec.items()})


def _layout(spec: Any, signature: Signature, where: str) -> ItemLayout | None:
    if spec is None or spec == "rows":
        return None
    if isinstance(spec, str):
        spec = {"type": spec}
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    args = {k: v for k, v in spec.items() if k != "type"} if isinstance(spec, Mapping) else {}
    if kind == "rows":
        return None
    if kind == "transition":
        if "next_fields" in args:
            args["next_fields"] = tuple(args["next_fields"])
        return ItemLayout.transition(signature, **args)
    if kind == "sequence":
        return ItemLayout.sequence(signature, **args)
    raise InvalidArgumentError(
        f"{where}.layout={describe(spec)} is unknown; use 'rows', "
        "{type='transition', n_step=..} or {type='sequence', length=..}"
    )


def _limiter(spec: Any, where: str) -> RateLimiter | None:
    if spec is None:
        return None
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if kind not in LIMITERS:
        raise InvalidArgumentError(
            f"{where}.rate_limiter={describe(spec)} is unknown; give type= one of "
            f"{sorted(LIMITERS)}"
        )
    return LIMITERS[kind](**{k: v for k, v in spec.items() if k != "type"})


def tables_from_config(config: Mapping[str, Any]) -> list[Table]:
    """Tables described by ``config`` (see the module docstring).

    Raises:
        InvalidArgumentError: naming the table or store and the entry that is wrong.
    """
    stores: dict[str, StepStore] = {}
    for i, entry in enumerate(config.get("store", [])):
        where = f"store[{i}]"
        try:
            stores[entry["name"]] = StepStore(
                _signature(entry.get("signature"), where),
                entry["capacity"],
                entry.get("lanes", 1),
            )
        except (KeyError, TypeError) as exc:
            raise InvalidArgumentError(f"{where} needs name, capacity and signature") from exc
    tables = []
    entries = config.get("table", [])
    if not entries:
        raise InvalidArgumentError("the configuration defines no [[table]]")
    for i, entry in enumerate(entries):
        where = f"table[{i}]"
        unknown = set(entry) - TABLE_KEYS
        if unknown:
            raise InvalidArgumentError(
                f"{where} has unknown keys {sorted(unknown)}; allowed: {sorted(TABLE_KEYS)}"
            )
        if "name" not in entry:
            raise InvalidArgumentError(f"{where} needs a name")
        kwargs: dict[str, Any] = {}
        if "store" in entry:
            if entry["store"] not in stores:
                raise InvalidArgumentError(
                    f"{where}.store={entry['store']!r} is not a [[store]] name: {list(stores)}"
                )
            kwargs["store"] = stores[entry["store"]]
            signature = kwargs["store"].signature
        else:
            signature = _signature(entry.get("signature"), where)
            kwargs["signature"] = signature
            if "capacity" in entry:
                kwargs["capacity"] = entry["capacity"]
        kind = entry.get("kind", "table")
        if kind in ("queue", "stack"):
            make = Table.queue if kind == "queue" else Table.stack
            tables.append(make(entry["name"], entry["size"], **kwargs))
            continue
        layout = _layout(entry.get("layout"), signature, where)
        if layout is not None:
            kwargs["layout"] = layout
        for role in ("sampler", "remover"):
            if role in entry:
                kwargs[role] = selector_from_config(dict(entry[role]))
        limiter = _limiter(entry.get("rate_limiter"), where)
        if limiter is not None:
            kwargs["rate_limiter"] = limiter
        for key in ("max_size", "max_times_sampled", "default_priority", "on_overwrite", "seed"):
            if key in entry:
                kwargs[key] = entry[key]
        tables.append(Table(entry["name"], **kwargs))
    return tables
