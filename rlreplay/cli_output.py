"""The text tables the ``rlreplay`` command line prints (``info`` and ``info --build``)."""

from __future__ import annotations

INFO_COLUMNS = (
    ("table", "name", "{}"),
    ("size", "size", "{}"),
    ("capacity", "max_size", "{}"),
    ("sampler", "sampler", "{}"),
    ("remover", "remover", "{}"),
    ("inserts/s", "inserts_per_s", "{:.1f}"),
    ("samples/s", "samples_per_s", "{:.1f}"),
    ("spi", "samples_per_insert", "{:.3g}"),
    ("ins blocked s", "insert_blocked_s", "{:.2f}"),
    ("smp blocked s", "sample_blocked_s", "{:.2f}"),
)


def format_columns(rows: list[list[str]]) -> list[str]:
    """Rows of cells as left-aligned text columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def format_info(stats: dict[str, dict]) -> str:
    """A text table of ``Client.server_info()`` output, then each table's limiter."""
    rows = [[h for h, _, _ in INFO_COLUMNS]]
    for info in stats.values():
        rows.append([fmt.format(info[key]) for _, key, fmt in INFO_COLUMNS])
    lines = format_columns(rows)
    for name, info in stats.items():
        lim = ", ".join(f"{k}={v:g}" for k, v in info["rate_limiter"].items())
        lines.append(f"{name}: limiter({lim}) inserts={info['inserts']} samples={info['samples']}")
    return "\n".join(lines)


def format_build() -> str:
    """The package version and whether each compiled kernel is active, and why not."""
    import platform

    import numpy as np

    import rlreplay
    from rlreplay.core._compiled import kernel_status

    rows = [["kernel", "active", "why"]]
    for status in kernel_status():
        rows.append([status.module, "yes" if status.active else "no", status.reason])
    header = (
        f"rlreplay {rlreplay.__version__} (Python {platform.python_version()}, "
        f"numpy {np.__version__})"
    )
    return "\n".join([header, *format_columns(rows)])
