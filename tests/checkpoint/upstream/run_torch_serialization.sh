#!/usr/bin/env bash
# torch's own test/test_serialization.py, plain, armed (COMPATSHIM_AUTO=1) and hardened
# (COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1), in one env; compare.py lists every test
# whose outcome differs.
#
#   tests/checkpoint/upstream/run_torch_serialization.sh PYTHON TEST_FILE OUT_DIR [plain|armed|hardened ...]
#
# PYTHON: an env with torch and compatshim (or PYTHONPATH=<checkout>/src set; the
#   start-up hook then imports that copy); torch.testing._internal needs expecttest.
# TEST_FILE: torch's test/test_serialization.py of the installed release (never committed
#   here); it runs from OUT_DIR's copy, so nothing of it lands in this checkout.
set -u
here=$(cd "$(dirname "$0")" && pwd)
case $1 in */*) python=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") ;; *) python=$1 ;; esac
out=$(mkdir -p "$3" && cd "$3" && pwd)
cp "$2" "$out/test_serialization.py" || exit 2
shift 3
cd "$out" || exit 2
for mode in ${*:-plain armed hardened}; do
  auto=1; safe=0
  [ "$mode" = plain ] && auto=0
  [ "$mode" = hardened ] && safe=1
  COMPATSHIM_AUTO=$auto COMPATSHIM_SAFE_LOAD=$safe timeout 1800 "$python" -m pytest \
    -p no:cacheprovider -q -rA --junitxml "$out/$mode.xml" test_serialization.py > "$out/$mode.log" 2>&1
  echo "$mode: $(tail -1 "$out/$mode.log")"
done
"$python" "$here/compare.py" "$out" ${*:-plain armed hardened}
