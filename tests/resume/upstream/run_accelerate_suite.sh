#!/usr/bin/env bash
# accelerate's own tests (its Makefile's test_core and test_big_modeling sets), plain, armed
# (COMPATSHIM_AUTO=1) and hardened (COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1), in one env;
# tests/checkpoint/upstream/compare.py lists every test whose outcome differs.
#
#   tests/resume/upstream/run_accelerate_suite.sh PYTHON TESTS_DIR OUT_DIR [plain|armed|hardened ...]
#
# PYTHON: an env with accelerate X, its extras["testing"] packages that install here, and
#   compatshim installed (the start-up hook is its .pth file).
# TESTS_DIR: a folder holding accelerate's tests/ of tag vX (never committed here), e.g.
#   git -C <accelerate clone> archive v1.14.0 tests | tar -x -C /tmp/acc-1.14
# ACCELERATE_SUITE_PATHS (optional): test paths under TESTS_DIR instead of the two sets.
set -u
here=$(cd "$(dirname "$0")" && pwd)
case $1 in */*) python=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") ;; *) python=$1 ;; esac
tests=$(cd "$2" && pwd); out=$(mkdir -p "$3" && cd "$3" && pwd); shift 3
cd "$tests" || exit 2
paths=${ACCELERATE_SUITE_PATHS:-tests --ignore=tests/test_examples.py --ignore=tests/test_cli.py \
  --ignore=tests/deepspeed --ignore=tests/fsdp --ignore=tests/tp}
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
for mode in ${*:-plain armed hardened}; do
  auto=1; safe=0
  [ "$mode" = plain ] && auto=0
  [ "$mode" = hardened ] && safe=1
  # shellcheck disable=SC2086  # paths is a list of pytest arguments
  COMPATSHIM_AUTO=$auto COMPATSHIM_SAFE_LOAD=$safe timeout 3600 "$python" -m pytest \
    -p no:cacheprovider -q -rfE --timeout 600 --junitxml "$out/$mode.xml" $paths > "$out/$mode.log" 2>&1
  echo "$mode: $(tail -1 "$out/$mode.log")"
done
"$python" "$here/../../checkpoint/upstream/compare.py" "$out" ${*:-plain armed hardened}
