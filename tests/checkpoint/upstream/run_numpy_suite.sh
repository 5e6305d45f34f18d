#!/usr/bin/env bash
# numpy's own tests (shipped inside the installed wheel, never copied here) plain, armed
# (COMPATSHIM_AUTO=1) and hardened (COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1), in one env;
# compare.py lists every test whose outcome differs.
#
#   tests/checkpoint/upstream/run_numpy_suite.sh PYTHON OUT_DIR [plain|armed|hardened ...]
#
# PYTHON: an env with numpy, pytest and hypothesis, and compatshim installed (the start-up
#   hook is its .pth file). The modules run are where compatshim's numpy patches reach:
#   numpy.load/save and the .npy format (numpy-load-hardened), pickling of arrays, dtypes,
#   records, masked arrays and bit generators (numpy-core-names), numpy's public API and
#   its numpy.core shim (removed-names). NUMPY_SUITE_MODULES (optional): others instead.
set -u
here=$(cd "$(dirname "$0")" && pwd)
case $1 in */*) python=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") ;; *) python=$1 ;; esac
out=$(mkdir -p "$2" && cd "$2" && pwd); shift 2
modules=${NUMPY_SUITE_MODULES:-numpy.lib.tests.test_format numpy.lib.tests.test_io \
  numpy.lib.tests.test_npyio numpy._core.tests.test_multiarray numpy._core.tests.test_regression \
  numpy._core.tests.test_records numpy._core.tests.test_dtype numpy.ma.tests.test_core \
  numpy.random.tests.test_direct numpy.random.tests.test_smoke numpy.random.tests.test_generator_mt19937 \
  numpy.tests.test_public_api numpy.tests.test_reloading numpy.tests.test_lazyloading}
# test ids named from site-packages (numpy.lib.tests.test_format::...), so that compare.py
# tells apart tests of the same name in two modules
root=$("$python" -c "import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))")
cd "$out" || exit 2
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
for mode in ${*:-plain armed hardened}; do
  auto=1; safe=0
  [ "$mode" = plain ] && auto=0
  [ "$mode" = hardened ] && safe=1
  present=()
  for module in $modules; do  # a module this numpy lacks (older or newer layout) is left out
    "$python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$module') is None)" \
      2>/dev/null && present+=("$module")
  done
  COMPATSHIM_AUTO=$auto COMPATSHIM_SAFE_LOAD=$safe timeout 3600 "$python" -m pytest \
    -p no:cacheprovider -q -rfE --timeout 600 --rootdir "$root" --junitxml "$out/$mode.xml" --pyargs \
    "${present[@]}" > "$out/$mode.log" 2>&1
  echo "$mode: ${#present[@]} modules: $(tail -1 "$out/$mode.log")"
done
"$python" "$here/compare.py" "$out" ${*:-plain armed hardened}
