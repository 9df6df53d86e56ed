"""The README opens with the two set-up commands and documents every command-line command.

(Its code examples are run by ``tests/test_doc_examples.py``.)
"""

import re
from pathlib import Path

from rlreplay.cli import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_opens_with_the_install_and_the_test_command():
    first_block = README.read_text().split("```")[1]
    language, *lines = first_block.strip().splitlines()
    commands = [line.split("#")[0].strip() for line in lines]
    assert language == "bash"
    assert commands == [
        'python -m pip install ".[examples]" && rlreplay demo',
        'python -m pip install -e ".[test]" && python -m pytest',
    ]


def test_readme_documents_every_command_and_the_build_report():
    text = README.read_text()
    parser = build_parser()
    (commands,) = [a.choices for a in parser._subparsers._group_actions]
    for name in commands:
        assert re.search(rf"`rlreplay {name}\b", text), name
    assert "rlreplay info --build" in text and "rlreplay --version" in text
