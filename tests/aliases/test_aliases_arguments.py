"""``compatshim.aliases.needed``/``resolve``: a wrong argument is an error naming it."""

from __future__ import annotations

from typing import Any

import pytest

from compatshim.aliases import needed, resolve
from compatshim.aliases.table import TABLE


@pytest.mark.parametrize("alias", [None, "np.float", TABLE[0].name])
def test_needed_wants_an_alias(alias: Any) -> None:
    with pytest.raises(TypeError, match=r"^alias: expected a compatshim\.aliases\.Alias"):
        needed(alias)


def test_needed_answers_for_every_table_entry() -> None:
    assert all(isinstance(needed(alias), bool) for alias in TABLE)


@pytest.mark.parametrize("dotted", [None, 5, b"os.path.join"])
def test_resolve_wants_a_str(dotted: Any) -> None:
    with pytest.raises(TypeError, match=r"^dotted: expected a name such as"):
        resolve(dotted)


@pytest.mark.parametrize("dotted", ["os", "os.", ""])
def test_resolve_wants_module_dot_attribute(dotted: str) -> None:
    with pytest.raises(ValueError, match=r"^dotted: expected a name such as"):
        resolve(dotted)


def test_resolve_finds_the_object() -> None:
    import os.path

    assert resolve("os.path.join") is os.path.join


def test_a_name_not_provided_names_a_caller_under_a_folder_called_compatshim(
    tmp_path: Any,
) -> None:
    """The caller search skipped every file whose path held "compatshim", so a script in
    ~/compatshim-trials/ was passed over for a frame of whoever ran it."""
    import runpy

    folder = tmp_path / "compatshim-trials"
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(
        "from compatshim.aliases._missing import not_provided\n"
        "error = not_provided('torch._six', 'nope', 'torch 2.0 removed torch._six')\n"
    )
    error = runpy.run_path(str(script))["error"]
    assert f"(asked by {script}:2)" in str(error)
