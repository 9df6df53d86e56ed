"""Build tables from a plain configuration mapping (the parsed ``tables.toml``).

Format (TOML shown; any mapping of the same shape works)::

    [[store]]                      # optional: steps shared by several tables
    name = "steps"
    capacity = 100000              # or: capacity_bytes = N (a byte budget, resolved to steps)
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
    warn_after = 5.0               # seconds before a blocked call's warning; false: never

    [[table]]
    name = "queue"
    kind = "queue"                 # or "stack": Table.queue / Table.stack, which set the
    size = 1000                    # sampler, remover, limiter and max_size (= size) themselves
    signature = { obs = { shape = [4], dtype = "float32" } }

Every ``[[store]]`` and ``[[table]]`` is an array of tables (two brackets). Every mistake
raises :class:`~rlreplay.errors.InvalidArgumentError` naming the entry and key, before
anything is served.
"""

from __future__ import annotations

import copy
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from rlreplay.core.layout import ItemLayout
from rlreplay.core.rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio
from rlreplay.core.selectors import selector_from_config
from rlreplay.core.specs import FieldSpec, Signature
from rlreplay.core.storage import StepStore
from rlreplay.core.table import Table
from rlreplay.errors import InvalidArgumentError, check_keywords, describe

# An example of the format, installed with the package (examples/tables.toml in a checkout).
EXAMPLE_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "examples", "tables.toml"
)

LIMITERS = {
    "MinSize": MinSize,
    "SampleToInsertRatio": SampleToInsertRatio,
    "Queue": Queue,
    "RateLimiter": RateLimiter,
}
TOP_KEYS = {"store", "table"}
STORE_KEYS = {"name", "capacity", "capacity_bytes", "signature", "lanes"}
TABLE_KEYS = {
    "name", "store", "signature", "capacity", "capacity_bytes", "max_size", "layout",
    "sampler", "remover", "rate_limiter", "max_times_sampled", "default_priority",
    "on_overwrite", "seed", "kind", "size", "warn_after",
}  # fmt: skip
KINDS = ("table", "queue", "stack")
ORDERED_FIXED = {
    "sampler", "remover", "rate_limiter", "max_size", "max_times_sampled", "on_overwrite",
}  # fmt: skip


def load_config(path: str | os.PathLike) -> list[Table]:
    """Tables described by the TOML file at ``path`` (see the module docstring).

        InvalidArgumentError: if the file is missing or unreadable, is not valid TOML (with
            line and column), or describes tables wrongly.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            config = tomllib.load(f)
    except FileNotFoundError:
        raise InvalidArgumentError(
            f"config file {name!r} does not exist; give the path of a tables.toml "
            f"({EXAMPLE_CONFIG} is one)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"config file {name!r} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        hint = _single_bracket_hint(name)
        raise InvalidArgumentError(f"config file {name!r} is not valid TOML: {exc}{hint}") from None
    try:
        return tables_from_config(config)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"config file {name!r}: {exc}") from None


SINGLE_BRACKET = re.compile(r"^[ \t]*\[[ \t]*(table|store)[ \t]*\][ \t]*(?:#.*)?$", re.MULTILINE)


def _single_bracket_hint(name: str) -> str:
    """Advice for a TOML error caused by single-bracket ``[table]`` or ``[store]`` headers."""
    try:
        with open(name, encoding="utf-8", errors="replace") as f:
            found = SINGLE_BRACKET.search(f.read())
    except OSError:
        return ""
    if found is None:
        return ""
    return "; " + _double_brackets(found.group(1))


def _double_brackets(key: str) -> str:
    return (
        f"[{key}] must be written [[{key}]] (two brackets, an array of tables: one "
        f"[[{key}]] header per {key})"
    )


def _entries(config: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """``config[key]`` as a list of mappings: ``[[key]]`` entries, not a single ``[key]``."""
    entries = config.get(key, [])
    if isinstance(entries, Mapping):
        raise InvalidArgumentError(_double_brackets(key))
    if not isinstance(entries, list):
        raise InvalidArgumentError(f"{key}={describe(entries)} must be a list of [[{key}]] entries")
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise InvalidArgumentError(
                f"{key}[{i}]={describe(entry)} must be a table of keys (a [[{key}]] entry)"
            )
    return entries


def _where(kind: str, i: int, entry: Mapping[str, Any]) -> str:
    name = entry.get("name")
    return f"{kind}[{i}] {name!r}" if isinstance(name, str) else f"{kind}[{i}]"


def _signature(spec: Any, where: str) -> Signature:
    if not isinstance(spec, Mapping) or not spec:
        raise InvalidArgumentError(
            f"{where}: signature={describe(spec)} must be a table of fields, e.g. "
            '{ obs = { shape = [4], dtype = "float32" }, reward = "float32" }'
        )

    def leaf(value: Any) -> Any:
        if isinstance(value, Mapping) and set(value) <= {"shape", "dtype"} and value:
            shape = value.get("shape", [])
            if not isinstance(shape, list):
                raise InvalidArgumentError(
                    f"{where}: shape={describe(shape)} in the signature must be a list such as "
                    "[4] or [84, 84] ([] for a scalar)"
                )
            return FieldSpec(tuple(shape), value.get("dtype", "float32"))
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
        f"{where}: layout={describe(spec)} is unknown; use 'rows', "
        "{type='transition', n_step=..} or {type='sequence', length=..}"
    )


def _limiter(spec: Any, where: str) -> RateLimiter | None:
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise InvalidArgumentError(
            f"{where}: rate_limiter={describe(spec)} must be a table such as "
            f'{{ type = "MinSize", min_size_to_sample = 1 }}, type one of {sorted(LIMITERS)}'
        )
    kind = spec.get("type")
    if kind not in LIMITERS:
        raise InvalidArgumentError(
            f"{where}: rate_limiter={describe(spec)} is unknown; give type= one of "
            f"{sorted(LIMITERS)}"
        )
    args = {k: v for k, v in spec.items() if k != "type"}
    check_keywords(LIMITERS[kind], args, f"{where}: rate_limiter {kind}")
    return LIMITERS[kind](**args)


def _selector(spec: Any, where: str, role: str):
    if not isinstance(spec, Mapping):
        raise InvalidArgumentError(
            f'{where}: {role}={describe(spec)} must be a table such as {{ type = "Uniform" }}'
        )
    return selector_from_config(dict(spec))


def _check_keys(entry: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(entry) - allowed
    if unknown:
        raise InvalidArgumentError(
            f"{where} has unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}"
        )


def _build(where: str, make: Any, *args: Any, **kwargs: Any) -> Any:
    """``make(*args, **kwargs)``, with a wrong argument reported as the entry's error."""
    try:
        return make(*args, **kwargs)
    except InvalidArgumentError as exc:
        message = str(exc)
        if message.startswith(where):
            raise
        named = copy.copy(exc)  # the same class and attributes (e.g. the bytes needed)
        named.args = (f"{where}: {message}",)
        raise named from None
    except (TypeError, ValueError, KeyError) as exc:
        raise InvalidArgumentError(f"{where}: {type(exc).__name__}: {exc}") from None
    except MemoryError as exc:
        raise InvalidArgumentError(
            f"{where}: {exc or 'out of memory'}; give a smaller capacity or max_size"
        ) from None


def _store(entry: Mapping[str, Any], where: str, stores: dict[str, StepStore]) -> StepStore:
    """The store an entry describes; ``stores``: those already built."""
    _check_keys(entry, STORE_KEYS, where)
    missing = [k for k in ("name", "signature") if k not in entry]
    if "capacity" not in entry and "capacity_bytes" not in entry:
        missing.append("capacity")
    if missing:
        raise InvalidArgumentError(
            f"{where} needs name, capacity (or capacity_bytes) and signature; missing {missing}"
        )
    if not isinstance(entry["name"], str):
        raise InvalidArgumentError(f'{where} needs name = "..." (a string)')
    if entry["name"] in stores:
        raise InvalidArgumentError(f"{where}: another [[store]] has this name")
    signature = _build(where, _signature, entry["signature"], where)
    return _build(
        where,
        StepStore,
        signature,
        entry.get("capacity"),
        entry.get("lanes", 1),
        capacity_bytes=entry.get("capacity_bytes"),
    )


def _table(entry: Mapping[str, Any], where: str, stores: dict[str, StepStore]) -> Table:
    _check_keys(entry, TABLE_KEYS, where)
    if not isinstance(entry.get("name"), str):
        raise InvalidArgumentError(f'{where} needs name = "..." (a string)')
    kind = entry.get("kind", "table")
    if kind not in KINDS:
        raise InvalidArgumentError(f"{where}: kind={describe(kind)} must be one of {KINDS}")
    ordered = kind in ("queue", "stack")
    if ordered:
        fixed = sorted(ORDERED_FIXED & set(entry))
        if fixed:
            raise InvalidArgumentError(
                f'{where}: kind = "{kind}" sets {fixed} itself; leave them out (size = N '
                "is its max_size)"
            )
        if "size" not in entry:
            raise InvalidArgumentError(f'{where}: kind = "{kind}" needs size = N (items)')
    elif "size" in entry:
        raise InvalidArgumentError(
            f'{where}: size is for kind = "queue" or "stack"; a table takes max_size = N'
        )
    kwargs: dict[str, Any] = {}
    if "store" in entry:
        if not isinstance(entry["store"], str) or entry["store"] not in stores:
            raise InvalidArgumentError(
                f"{where}: store={describe(entry['store'])} is not a [[store]] name: {list(stores)}"
            )
        kwargs["store"] = stores[entry["store"]]
        signature = kwargs["store"].signature
    else:
        signature = _build(where, _signature, entry.get("signature"), where)
        kwargs["signature"] = signature
        for key in ("capacity", "capacity_bytes"):
            if key in entry:
                kwargs[key] = entry[key]
    layout = _build(where, _layout, entry.get("layout"), signature, where)
    if layout is not None:
        kwargs["layout"] = layout
    for role in ("sampler", "remover"):
        if role in entry:
            kwargs[role] = _build(where, _selector, entry[role], where, role)
    limiter = _build(where, _limiter, entry.get("rate_limiter"), where)
    if limiter is not None:
        kwargs["rate_limiter"] = limiter
    for key in ("max_size", "max_times_sampled", "default_priority", "on_overwrite", "seed"):
        if key in entry:
            kwargs[key] = entry[key]
    never_warn = entry.get("warn_after") is False  # TOML has no None: false means never
    if "warn_after" in entry and not never_warn:
        kwargs["warn_after"] = entry["warn_after"]
    if ordered:
        make = Table.queue if kind == "queue" else Table.stack
        table = _build(where, make, entry["name"], entry["size"], **kwargs)
    else:
        table = _build(where, Table, entry["name"], **kwargs)
    if never_warn:
        table.warn_after = None
    return table


def tables_from_config(config: Mapping[str, Any]) -> list[Table]:
    """Tables described by ``config`` (see the module docstring).

    Raises:
        InvalidArgumentError: naming the table or store and the entry that is wrong.
    """
    if not isinstance(config, Mapping):
        raise InvalidArgumentError(f"config={describe(config)} must be a mapping")
    _check_keys(config, TOP_KEYS, "the configuration")
    store_entries = _entries(config, "store")
    table_entries = _entries(config, "table")
    if not table_entries:
        raise InvalidArgumentError("the configuration defines no [[table]]")
    stores: dict[str, StepStore] = {}
    for i, entry in enumerate(store_entries):
        where = _where("store", i, entry)
        stores[entry["name"]] = _store(entry, where, stores)
    names = [e.get("name") for e in table_entries]
    duplicates = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
    if duplicates:
        raise InvalidArgumentError(f"table names must be unique; repeated: {duplicates}")
    return [
        _table(entry, _where("table", i, entry), stores) for i, entry in enumerate(table_entries)
    ]
