"""``rlreplay export``: a checkpoint's tables as a dataset, on the command line.

``CHECKPOINT`` is a checkpoint directory or a directory of them (the newest valid one is
used), memory-mapped. ``--npz`` writes the tables' steps and items; ``--minari`` writes a
table's whole episodes. See docs/checkpoints.md, "Datasets".
"""

from __future__ import annotations

import argparse
from typing import Any

from rlreplay.cli.parsing import CommandError


def _step_id(text: str) -> int:
    """An argparse type: a step id (an integer >= 0)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step id (an integer >= 0)")
    return value


def add_export_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export", help="write a checkpoint's tables as a dataset (.npz, or a Minari dataset)"
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint or its directory")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--npz", default=None, metavar="FILE", help="write a columnar .npz")
    out.add_argument("--minari", default=None, metavar="DATASET_ID", help="write a Minari dataset")
    p.add_argument(
        "--tables",
        default=None,
        metavar="NAME,...",
        help="tables to export (default: all over one store; --minari: the only one)",
    )
    p.add_argument("--first-id", type=_step_id, default=None, metavar="N", help="first step id")
    p.add_argument("--end-id", type=_step_id, default=None, metavar="N", help="step id to stop at")
    p.add_argument("--item-data", action="store_true", help="--npz: also each item's outputs")
    p.add_argument("--minari-root", default=None, metavar="DIR", help="Minari's datasets root")
    p.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="ROLE=COLUMN",
        help="--minari: the column of a role (observation, action, reward, terminated, "
        "truncated, next_observation); repeat for several",
    )
    p.set_defaults(func=cmd_export)


def _chosen(tables: dict, names: str | None, minari: bool) -> list:
    """The restored tables ``--tables`` names (default: all, which must share a store);
    CommandError otherwise."""
    if names is None:
        chosen = list(tables.values())
        if len({id(t.store) for t in chosen}) > 1:
            raise CommandError(
                f"the checkpoint holds tables {sorted(tables)} over several stores; name "
                "tables over one store with --tables NAME,..."
            )
        return chosen[:1] if minari else chosen  # --minari: the steps of their one store
    wanted = [n for n in names.split(",") if n]
    unknown = [n for n in wanted if n not in tables]
    if unknown or not wanted:
        raise CommandError(
            f"--tables {names!r} names {unknown or 'no table'}; the checkpoint holds "
            f"{sorted(tables)}"
        )
    if minari and len(wanted) != 1:
        raise CommandError("--minari exports the steps of one table's store: name one table")
    return [tables[n] for n in wanted]


def _fields(pairs: list[str]) -> dict[str, str] | None:
    """``--field ROLE=COLUMN`` pairs as export_minari's ``fields``."""
    out = {}
    for pair in pairs:
        role, _, column = pair.partition("=")
        if not role or not column:
            raise CommandError(f"--field {pair!r} must be ROLE=COLUMN, e.g. observation=state")
        out[role] = column
    return out or None


def cmd_export(args: argparse.Namespace) -> int:
    """Restore the checkpoint memory-mapped and export the chosen tables."""
    from rlreplay.checkpoint import restore
    from rlreplay.errors import CheckpointNotFoundError

    if args.minari is None and (args.field or args.minari_root):
        raise CommandError("--field and --minari-root go with --minari DATASET_ID")
    if args.npz is None and args.item_data:
        raise CommandError("--item-data goes with --npz FILE")
    try:
        tables = restore(args.checkpoint, mmap=True)
    except CheckpointNotFoundError as exc:  # a wrong CHECKPOINT argument: exit status 2
        raise CommandError(str(exc)) from None
    chosen = _chosen(tables, args.tables, args.minari is not None)
    span = {"first_id": args.first_id, "end_id": args.end_id}
    if args.npz is not None:
        from rlreplay.datasets.npz import export_npz

        path = export_npz(chosen, args.npz, item_data=args.item_data, **span)
        items = ", ".join(f"{t.name}: {t.size} items" for t in chosen)
        print(f"wrote {path} ({items})", flush=True)
        return 0
    from rlreplay.datasets.minari import export_minari

    dataset = export_minari(
        chosen[0],
        args.minari,
        root=args.minari_root,
        fields=_fields(args.field),
        **span,
    )
    print(
        f"wrote Minari dataset {args.minari} ({dataset.total_episodes} episodes, "
        f"{dataset.total_steps} steps)",
        flush=True,
    )
    return 0
