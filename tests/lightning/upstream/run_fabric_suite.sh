#!/usr/bin/env bash
# Lightning's own tests (tests_fabric, or tests_pytorch with LIGHTNING_SUITE=tests_pytorch),
# plain and armed (COMPATSHIM_AUTO=1), in one venv.
#
#   tests/lightning/upstream/run_fabric_suite.sh PYTHON TESTS_DIR OUT_DIR [plain|armed ...]
#
# PYTHON: a venv with the lightning pins of matrix/lightning-X.txt, Lightning's
#   requirements/fabric/test.txt (requirements/pytorch/test.txt and extra.txt for
#   tests_pytorch) of the matching tag, and compatshim installed.
# TESTS_DIR: that tag's tests/ folder, e.g.
#   git -C <lightning clone> archive 2.6.5 tests | tar -x -C /tmp/lightning-2.6.5
# OUT_DIR: junit files and logs; summarise them with summarise.py. (pytest's cache
#   plugin stays on: Lightning 2.4's conftest reads its --failed-first option.)
# FABRIC_SUITE_PATHS (optional): test paths under the suite's folder for the suite part
#   instead of all of it, e.g. "test_fabric.py strategies utilities/test_distributed.py".
#
# Two parts per mode, as Lightning's CI runs them (LIGHTNING_PARTS="suite" or "standalone" for one):
#   suite       - every test of the suite's folder in one pytest process;
#   standalone  - the RunIf(standalone=True) tests (PL_RUN_STANDALONE_TESTS=1), each in
#                 its own pytest process like Lightning's run_standalone_tests.sh. A
#                 --setup-only pass sorts out those RunIf skips on this machine (GPU,
#                 DeepSpeed, XLA ...): they are counted as skipped, the rest are run.
set -u
case $1 in */*) python=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") ;; *) python=$1 ;; esac
tests=$(cd "$2" && pwd); out=$(mkdir -p "$3" && cd "$3" && pwd); shift 3
modes=${*:-plain armed}
here=$(cd "$(dirname "$0")" && pwd)
suite=${LIGHTNING_SUITE:-tests_fabric}
cd "$tests/$suite" || { echo "no $suite under $tests (TESTS_DIR is the tag's tests/ folder)" >&2; exit 2; }
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
parts=${LIGHTNING_PARTS:-suite standalone}
for mode in $modes; do
  auto=0; [ "$mode" = armed ] && auto=1
  if [[ " $parts " == *" suite "* ]]; then
    echo "== $mode: suite"
    COMPATSHIM_AUTO=$auto "$python" -m pytest -o cache_dir="$out/.pytest_cache" -q -rfE --timeout 600 \
      --junitxml "$out/$mode-suite.xml" ${FABRIC_SUITE_PATHS:-.} > "$out/$mode-suite.log" 2>&1
    tail -1 "$out/$mode-suite.log"
  fi
  [[ " $parts " == *" standalone "* ]] || continue
  echo "== $mode: standalone"
  COMPATSHIM_AUTO=$auto PL_RUN_STANDALONE_TESTS=1 "$python" -m pytest -o cache_dir="$out/.pytest_cache" -q \
    --setup-only --continue-on-collection-errors --junitxml "$out/$mode-standalone-setup.xml" . > "$out/$mode-standalone-setup.log" 2>&1
  i=0
  for test_id in $("$python" "$here/summarise.py" --runnable "$out/$mode-standalone-setup.xml"); do
    i=$((i + 1))
    COMPATSHIM_AUTO=$auto PL_RUN_STANDALONE_TESTS=1 MASTER_PORT=$((29500 + i)) \
      timeout 900 "$python" -m pytest -o cache_dir="$out/.pytest_cache" -q -s --timeout 600 \
      --junitxml "$out/$mode-standalone-$i.xml" "$test_id" > "$out/$mode-standalone-$i.log" 2>&1
    echo "$test_id: $(tail -1 "$out/$mode-standalone-$i.log")"
  done
done
"$python" "$here/summarise.py" "$out"
