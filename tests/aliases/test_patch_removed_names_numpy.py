"""numpy: row_stack on >= 2.5, np.float/int/complex on >= 1.24; np.bool/np.long never touched."""

from __future__ import annotations

import pytest

from tests.aliases.helpers import run, version_at_least

np = pytest.importorskip("numpy")


@pytest.mark.skipif(not version_at_least("numpy", "2.5"), reason="numpy < 2.5 has row_stack")
def test_row_stack_is_vstack_armed_and_gone_after_uninstall() -> None:
    found = run(
        "import json, numpy as np, compatshim\n"
        "before = hasattr(np, 'row_stack')\n"
        "compatshim.install()\n"
        "from numpy import row_stack\n"
        "same = row_stack is np.vstack and np.row_stack is np.vstack\n"
        "value = np.row_stack([np.arange(2), np.arange(2)]).tolist()\n"
        "used = [r.used for r in compatshim.status() if r.name == 'removed-names'][0]\n"
        "compatshim.uninstall()\n"
        "print(json.dumps([before, same, value, used, hasattr(np, 'row_stack')]))"
    )
    assert found == [False, True, [[0, 1], [0, 1]], ["numpy.row_stack"], False]


@pytest.mark.skipif(not version_at_least("numpy", "1.24"), reason="numpy < 1.24 has np.complex")
def test_a_getattr_a_library_set_after_install_stays_and_ours_under_it_answers_nothing() -> None:
    found = run(
        "import json, numpy as np, compatshim\n"
        "numpys = vars(np).get('__getattr__')\n"
        "compatshim.install(include=['removed-names'])\n"
        "ours = vars(np)['__getattr__']\n"
        "def theirs(name): return ours(name)\n"
        "np.__getattr__ = theirs\n"
        "compatshim.uninstall(['removed-names'])\n"
        "kept = vars(np)['__getattr__'] is theirs\n"
        "gone = not hasattr(np, 'complex')\n"
        "np.__getattr__ = ours  # the library puts back what it found\n"
        "compatshim.install(include=['removed-names'])\n"
        "again = np.complex is complex and vars(np)['__getattr__'] is not ours\n"
        "compatshim.uninstall(['removed-names'])\n"
        "print(json.dumps([kept, gone, again, vars(np).get('__getattr__') is ours,\n"
        "                  not hasattr(np, 'complex'), ours.original is numpys]))"
    )
    assert found == [True, True, True, True, True, True]


@pytest.mark.skipif(version_at_least("numpy", "2.5"), reason="numpy >= 2.5 has no row_stack")
def test_row_stack_left_alone_where_numpy_has_it() -> None:
    found = run(
        "import json, numpy as np, compatshim; real = vars(np)['row_stack']\n"
        "compatshim.install()\n"
        "print(json.dumps([np.row_stack is real, 'row_stack' in "
        "getattr(vars(np).get('__getattr__'), 'entries', {})]))"
    )
    assert found == [True, False]


@pytest.mark.skipif(not version_at_least("numpy", "1.24"), reason="numpy < 1.24 has them")
def test_scalar_aliases_are_the_builtins_and_changed_names_are_untouched() -> None:
    found = run(
        "import json, warnings, numpy as np, compatshim\n"
        "def probe(name):\n"
        "    with warnings.catch_warnings():\n"
        "        warnings.simplefilter('ignore')\n"
        "        try:\n"
        "            return repr(getattr(np, name))\n"
        "        except AttributeError:\n"
        "            return 'missing'\n"
        "names = ('bool', 'long', 'object', 'str')\n"
        "before = [probe(n) for n in names]\n"
        "compatshim.install()\n"
        "builtins_ok = np.float is float and np.int is int and np.complex is complex\n"
        "after = [probe(n) for n in names]\n"
        "print(json.dumps([builtins_ok, before == after, after]))"
    )
    assert found[0] is True
    assert found[1] is True, found[2]
    if version_at_least("numpy", "2.0"):
        assert found[2][:2] == [repr(np.bool), repr(np.long)]


def test_table_never_aliases_a_changed_numpy_name() -> None:
    from compatshim.aliases.table import TABLE

    names = {alias.name for alias in TABLE}
    assert not names & {"numpy.bool", "numpy.long", "numpy.object", "numpy.str"}
    assert len(names) == len(TABLE)
    for alias in TABLE:
        assert alias.kind in ("identical", "adapter") and alias.evidence
        assert alias.provides in ("module", "attribute", "keyword")


def test_the_catalogue_row_targets_every_module_the_table_names() -> None:
    from compatshim.aliases.table import ATTRIBUTE_MODULES
    from compatshim.patches import CATALOGUE

    (row,) = [patch for patch in CATALOGUE if patch.name == "removed-names"]
    assert row.targets == ("compatshim", *ATTRIBUTE_MODULES)
    assert all(row.distribution_for(m) != "compatshim" for m in ATTRIBUTE_MODULES)
