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


#: ``pickle.dumps(np.char.array(["a", "bc"]), protocol=2)`` under numpy 1.24.4: the class is
#: ``numpy.chararray`` there (numpy 2.0-2.4 warn on that name, numpy 2.5 has none).
CHARARRAY_NUMPY1 = (
    b"\x80\x02cnumpy.core.multiarray\n_reconstruct\nq\x00cnumpy\nchararray\nq\x01K\x00\x85q\x02"
    b"c_codecs\nencode\nq\x03X\x01\x00\x00\x00bq\x04X\x06\x00\x00\x00latin1q\x05\x86q\x06Rq\x07"
    b"\x87q\x08Rq\t(K\x01K\x02\x85q\ncnumpy\ndtype\nq\x0bX\x02\x00\x00\x00U2q\x0c\x89\x88\x87q\r"
    b"Rq\x0e(K\x03X\x01\x00\x00\x00<q\x0fNNNK\x08K\x04K\x08tq\x10b\x89h\x03X\x10\x00\x00\x00a"
    b"\x00\x00\x00\x00\x00\x00\x00b\x00\x00\x00c\x00\x00\x00q\x11h\x05\x86q\x12Rq\x13tq\x14b."
)


@pytest.mark.skipif(not version_at_least("numpy", "2.5"), reason="numpy < 2.5 has np.chararray")
def test_chararray_of_a_numpy1_pickle_loads_armed() -> None:
    found = run(
        "import json, pickle, numpy as np, compatshim\n"
        f"data = {CHARARRAY_NUMPY1!r}\n"
        "try:\n    pickle.loads(data)\n    plain = 'loaded'\n"
        "except AttributeError as exc:  # the wording differs between Pythons\n"
        "    plain = 'chararray' in str(exc)\n"
        "compatshim.install()\n"
        "value = pickle.loads(data)\n"
        "same = type(value) is np.char.chararray and np.chararray is np.char.chararray\n"
        "compatshim.uninstall()\n"
        "print(json.dumps([plain, same, value.tolist(), hasattr(np, 'chararray')]))"
    )
    assert found == [True, True, ["a", "bc"], False]
