"""The README opens with the two set-up commands, and its links lead somewhere.

(Its code examples are run by ``tests/test_doc_examples.py``, which also checks that
docs/command_line.md documents every command-line command.)
"""

import re
from pathlib import Path

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


def test_readme_links_lead_to_files_of_the_repository():
    text = README.read_text()
    targets = re.findall(r"\]\(((?!https?:)[^)#]+)(?:#[^)]*)?\)", text)
    assert targets, "the README links to the docs"
    missing = [t for t in targets if not (README.parent / t).exists()]
    assert missing == [], missing


def test_readme_is_a_newcomers_page_with_a_short_quick_start():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "the rest belongs in docs/"
    quick_start = text.split("## Quick start", 1)[1].split("```python\n", 1)[1].split("```")[0]
    assert len(quick_start.splitlines()) <= 30


def test_readme_says_to_install_torch_before_the_examples_extra():
    extra = (README.parent / "pyproject.toml").read_text().split("\nexamples = [", 1)[1]
    torch = re.findall(r'"(torch[^"]*)"', extra.split("]", 1)[0])
    for page in (README, README.parent / "docs" / "index.md"):
        after_commands = " ".join(page.read_text().split("```")[2].split("\n\n")[1].split())
        assert f"`{torch[0]}`" in after_commands, page.name
        assert "install the torch build you want first" in after_commands, page.name
