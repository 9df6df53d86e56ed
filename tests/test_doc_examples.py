"""Every code example in README.md and the pages of docs/ runs as written.

Each page's ```python blocks run in order in one namespace, as a reader following the page
would run them (a later block may use what an earlier one built, never anything else), in
a scratch working folder. Blocks that need a server start one on 127.0.0.1 themselves.
Blocks fenced ```py instead are shown, not run: they need a Ray cluster (tests/distributed
runs what they show).
Every ``rlreplay ...`` line of the pages' shell blocks is parsed by the real command-line
parser, and the cheap ones (``keygen``, ``info --build``, ``--version``) are run.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rlreplay.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
# Every page of the docs site, its subfolders included.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(page: Path, language: str) -> list[tuple[int, str]]:
    """``(first line number, code)`` of every fenced block of ``language`` in ``page``."""
    text = page.read_text()
    return [
        (text.count("\n", 0, m.start(2)), m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1) == language
    ]


def shell_commands(page: Path) -> list[list[str]]:
    """The ``rlreplay`` command lines of the page's bash blocks, split into arguments."""
    commands = []
    for _, code in blocks(page, "bash"):
        for line in code.replace("\\\n", " ").splitlines():
            for command in line.split("#")[0].split("&&"):
                words = shlex.split(command)
                if words[:1] == ["rlreplay"]:
                    commands.append(words[1:])
    return commands


PYTHON_PAGES = [p for p in PAGES if blocks(p, "python")]
SHELL_PAGES = [p for p in PAGES if shell_commands(p)]

# What a page's examples must have done, beyond running without an error.
AFTERWARDS = {
    "README.md": lambda ns: (
        "weights" in ns  # the tour's prioritized branch ran
        and ns["weights"].shape == (256,)
        and ns["batch"].data["obs"].shape == (256, 17)
    ),
}


def test_the_pages_have_examples():
    assert ROOT / "README.md" in PYTHON_PAGES and ROOT / "README.md" in SHELL_PAGES


def test_the_command_line_page_documents_every_command_and_the_build_report():
    text = (ROOT / "docs" / "command_line.md").read_text()
    parser = build_parser()
    (commands,) = [a.choices for a in parser._subparsers._group_actions]
    for name in commands:
        assert re.search(rf"`rlreplay {name}\b", text), name
    assert "rlreplay info --build" in text and "rlreplay --version" in text


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_examples_run_as_written(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    for line, code in blocks(page, "python"):
        # Leading newlines make a traceback name the page's own line numbers.
        exec(compile("\n" * line + code, str(page), "exec"), namespace)
    check = AFTERWARDS.get(page.name)
    assert check is None or check(namespace), f"{page.name}: examples did not do their job"


CHEAP = {"keygen"}


@pytest.mark.parametrize("page", SHELL_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_rlreplay_command_lines_parse_and_the_cheap_ones_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parser = build_parser()
    for args in shell_commands(page):
        try:
            parsed = parser.parse_args(args)
        except SystemExit as exc:  # --help / --version exit 0; a usage error exits 2
            assert exc.code == 0, f"{page.name}: `rlreplay {shlex.join(args)}` does not parse"
            continue
        if args[0] in CHEAP or (args[0] == "info" and parsed.build and parsed.address is None):
            assert main(args) == 0, args
