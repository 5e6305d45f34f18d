"""The README and docs/ are checked like code: every ``python`` block runs, links resolve,
the patch table is the catalogue, and the API reference builds without a warning.

A ``python`` block runs as written, as a script in a fresh interpreter, in an empty
temporary folder.
A block whose first line is ``# needs: torch, numpy`` is skipped, with the reason, where one
of those modules cannot be imported (the lint env has torch and numpy, no framework).

``python -m tests.tooling.test_docs --write`` rewrites docs/patches.md's table from
:data:`compatshim.patches.CATALOGUE`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
    found += [ROOT / "matrix" / "HISTORY.md"]
    return [page for page in found if page.is_file()]


def base_of(page: Path) -> Path:
    """The folder the page's relative links start from."""
    return page.parent


class Block(NamedTuple):
    page: Path
    line: int
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def needs(self) -> list[str]:
        first = self.code.split("\n", 1)[0].strip()
        if not first.startswith("# needs:"):
            return []
        return [name.strip() for name in first[len("# needs:") :].split(",") if name.strip()]


FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


def blocks(language: str = "python") -> list[Block]:
    found = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start()) + 1
                found.append(Block(page, line, match.group(2)))
    return found


PYTHON_BLOCKS = blocks()


def test_there_are_blocks_to_run() -> None:
    assert len(PYTHON_BLOCKS) >= 10


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    missing = [name for name in block.needs() if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{block.id} needs {', '.join(missing)}, not installed here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    env["COMPATSHIM_TEST_DOC_BLOCK"] = block.id
    script = tmp_path / f"{block.page.stem}_line{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, script.name],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, f"{block.id} failed:\n{result.stdout}\n{result.stderr}"


# -- links -------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, re.M)}


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text(encoding="utf-8"))
    broken = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not checked offline
            continue
        path, _, anchor = target.partition("#")
        where = (base_of(page) / path).resolve() if path else page
        line = text.count("\n", 0, match.start()) + 1
        if not where.exists():
            broken.append(f"{page.relative_to(root)}:{line}: {target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{page.relative_to(root)}:{line}: {target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", pages(), ids=[str(p.relative_to(ROOT)) for p in pages()])
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top) [gone](missing.md) [anchor](page.md#nowhere)\n")
    assert [b.split(": ", 1)[1] for b in broken_links(page, tmp_path)] == [
        "missing.md (no such file)",
        "page.md#nowhere (no such heading)",
    ]


# -- the patch catalogue -------------------------------------------------------------------

PATCHES = DOCS / "patches.md"
TABLE_START = "<!-- patch table: generated from compatshim.patches.CATALOGUE -->"
TABLE_END = "<!-- end of patch table -->"


def patch_table() -> str:
    from compatshim.patches import CATALOGUE

    rows = [
        "| patch | distribution | code for | tested on | targets | what it fixes |",
        "|---|---|---|---|---|---|",
    ]
    for patch in CATALOGUE:
        targets = ", ".join(f"`{t}`" for t in patch.targets)
        description = patch.description.replace("|", "\\|")  # a cell of a Markdown table
        rows.append(
            f"| [`{patch.name}`](#{slug(patch.name)}) | {patch.distribution} "
            f"| {patch.requires or 'any'} | {patch.tested or 'per entry'} | {targets} "
            f"| {description} |"
        )
    return "\n".join(rows)


def written_table() -> str:
    text = PATCHES.read_text(encoding="utf-8")
    return text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()


def test_patch_table_is_the_catalogue() -> None:
    assert written_table() == patch_table(), (
        "docs/patches.md's table differs from compatshim.patches.CATALOGUE: "
        "python -m tests.tooling.test_docs --write"
    )


def test_every_patch_has_its_section() -> None:
    from compatshim.patches import CATALOGUE

    headings = anchors(PATCHES)
    assert [p.name for p in CATALOGUE if slug(p.name) not in headings] == []


def test_every_alias_is_named() -> None:
    from compatshim.aliases import TABLE

    text = (DOCS / "aliases.md").read_text(encoding="utf-8")
    names = [a.name.split("(")[0] for a in TABLE]
    # a keyword entry is named by its function (one row lists the object collectives)
    assert [n for n in names if n not in text and n.rsplit(".", 1)[-1] not in text] == []


@pytest.mark.parametrize(
    "command",
    [[], ["doctor"], ["inspect"], ["scan"], ["dcp-downgrade"], ["resume-check"], ["matrix"]],
)
def test_every_cli_flag_is_documented(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each option a subcommand's ``--help`` shows is named in the README or docs/
    (``resume-check --not-hardened`` was in no page)."""
    from compatshim.cli import main

    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    shown = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", capsys.readouterr().out))
    guides = [ROOT / "README.md", *DOCS.glob("*.md")]  # not the changelog: a user reads these
    text = "\n".join(page.read_text(encoding="utf-8") for page in guides)
    missing = [
        flag
        for flag in sorted(shown - {"-h", "--help"})
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)
    ]
    assert missing == [], f"compatshim {' '.join(command)}: {missing} in no page"


# -- the API reference ---------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_api_reference_builds(tmp_path: Path) -> None:
    pytest.importorskip("pdoc", reason="pdoc is in the dev extra (tox -e lint)")
    result = subprocess.run(
        [sys.executable, str(DOCS / "build_api.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "compatshim" / "checkpoint.html").is_file()


def _write() -> None:
    text = PATCHES.read_text(encoding="utf-8")
    head, rest = text.split(TABLE_START, 1)
    tail = rest.split(TABLE_END, 1)[1]
    PATCHES.write_text(f"{head}{TABLE_START}\n{patch_table()}\n{TABLE_END}{tail}", "utf-8")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    _write()
