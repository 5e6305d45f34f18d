"""``find_unpicklable`` on a 100,000-object graph, side by side with what a user would run.

Contenders, alternating in one process on the same graph:

- clean graph: ``find_unpicklable`` vs ``pickle.dumps`` (the cheapest "is it
  picklable?" check; it only says yes or no). Goal: a few seconds at most.
  A clean graph costs ``find_unpicklable`` one pickling pass into a sink.
- the same graph with one generator buried in one record: ``find_unpicklable``
  vs ``dill.detect.baditems(records)`` (when dill is installed), the usual
  tool for "which item is bad"; it returns the bad top-level records, not a
  path. (A generator, because dill pickles dict views and locks itself.)
  Here ``find_unpicklable`` walks the whole graph: this is the walk's cost.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import interleaved, median, ms, table

from compatshim.pickling import find_unpicklable

OBJECTS = 100_000
OBJECTS_PER_RECORD = 5  # the record, its __dict__, a list, a dict, a tuple


class Record:
    """A plain user object, like a dataset sample index entry."""

    def __init__(self, index: int) -> None:
        self.name = f"sample-{index}"
        self.values = [index * 0.5, index * 0.25, float(index)]
        self.meta = {"id": index, "tags": ("train", index % 7)}


def build_graph(objects: int = OBJECTS) -> dict[str, Any]:
    return {"records": [Record(index) for index in range(objects // OBJECTS_PER_RECORD)]}


def count_objects(graph: Any) -> int:
    """Non-atomic objects in the graph (the walk's unit of work), counted independently."""
    seen: set[int] = set()
    stack = [graph]
    while stack:
        obj = stack.pop()
        if isinstance(obj, (int, float, str, type(None))) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, Record):
            seen.add(id(vars(obj)))  # the state dict pickle walks
            stack.extend(vars(obj).values())
    return len(seen)


def main(repeats: int = 5) -> dict[str, float]:
    graph = build_graph()
    size = count_objects(graph)
    clean = interleaved(
        {
            "find_unpicklable": lambda: find_unpicklable(graph),
            "pickle.dumps": lambda: pickle.dumps(graph),
        },
        repeats,
    )
    assert find_unpicklable(graph) == []
    ours = median(clean["find_unpicklable"])
    base = median(clean["pickle.dumps"])
    ratios = {"clean_vs_pickle_dumps": ours / base, "clean_seconds": ours}
    rows = [
        [f"clean graph, {size:,} objects", "`find_unpicklable`", ms(ours), "[] (nothing found)"],
        ["", "`pickle.dumps`", ms(base), "bytes"],
        ["", "ratio", f"{ours / base:.2f}x", ""],
    ]

    culprit = graph["records"][12_345]
    culprit.meta["stream"] = (x for x in range(3))
    findings = find_unpicklable(graph, root="dataset")
    try:
        import dill.detect
    except ImportError:
        dill = None
    if dill is not None:
        dirty = interleaved(
            {
                "find_unpicklable": lambda: find_unpicklable(graph),
                "dill.detect.baditems": lambda: dill.detect.baditems(graph["records"]),
            },
            1,
            warmup=0,
        )
        bad = dill.detect.baditems(graph["records"])
        ours_dirty = median(dirty["find_unpicklable"])
        theirs = median(dirty["dill.detect.baditems"])
        ratios["dirty_vs_dill_baditems"] = ours_dirty / theirs
        rows += [
            ["one generator inside", "`find_unpicklable`", ms(ours_dirty), str(findings[0])],
            ["", "`dill.detect.baditems`", ms(theirs), f"{len(bad)} bad record(s), no path"],
            ["", "ratio", f"{ours_dirty / theirs:.2f}x", ""],
        ]
    else:
        rows.append(["one generator inside", "`find_unpicklable`", "", str(findings[0])])
        rows.append(["", "`dill.detect.baditems`", "dill not installed", ""])
    print("### find_unpicklable on a 100,000-object graph\n")
    print(table(["graph", "contender", "median", "result"], rows))
    print()
    return ratios


if __name__ == "__main__":
    print(main())
