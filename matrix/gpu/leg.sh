#!/usr/bin/env bash
# The GPU leg, one command from the checkout's root on a CUDA machine: `bash matrix/gpu/leg.sh`.
#
# The machine's own Python, CUDA torch and frameworks are used as they are; nothing is installed
# into them. What they lack comes as wheels in .whl/ (matrix/gpu/wheels.sh makes them on a machine
# with a package index) and goes, with this checkout's compatshim as an editable install (its
# start-up files compatshim_auto.pth/.start/.py and a RECORD naming them, so COMPATSHIM_AUTO=1
# arms the children the tests start), into an overlay venv over the machine's site-packages.
# Then the doctor (COMPATSHIM_AUTO=1) and, side by side:
#   1. the whole suite but the gpu/multigpu tests, `-n $GPU_WORKERS` with pytest-xdist;
#   2. the gpu/multigpu tests (CUDA RNG, ColossalAI on CUDA, 1-rank NCCL copies, EMA), one process;
# then 3. the GPU benchmarks (bench/run_all.py, one at a time, missing ones left out), and writes
# matrix/GPU.md and $OUT/GPU.md (matrix/gpu/make_gpu_md.py): device, driver, torch, CUDA, NCCL,
# command, counts per family, the whole-suite line, the benchmark tables. Raw output in $OUT.
# On a machine without CUDA it runs to the end and GPU.md says "no CUDA device" (a rehearsal).
#
# Knobs: OUT (default .gpu-out), GPU_PYTHON (python3), GPU_WORKERS (14), GPU_TESTS (tests),
# GPU_SUITE_S (360), GPU_BENCHES (bench_ema bench_map_location; "" runs none; bench_checkpoint, a
# CPU loader bench of fresh interpreters on a 1 GiB file, needs minutes: the bench env runs it),
# GPU_BENCH_S (60), GPU_PACK (unset; 1: $OUT ends as GPU.md and raw.tar.gz, the rest packed, for a
# tool that brings back few files); the benches run with BENCH_QUICK=1 (bench_map_location: the
# 512 MiB file, "fresh pages" heap, 3 repeats).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/.gpu-out}
mkdir -p "$OUT"
PY=${GPU_PYTHON:-python3}
WORKERS=${GPU_WORKERS:-14}
TESTS=${GPU_TESTS:-tests}
SUITE_S=${GPU_SUITE_S:-360}
BENCHES=${GPU_BENCHES-bench_ema bench_map_location}  # set and empty: none
BENCH_S=${GPU_BENCH_S:-60}
START=$(date +%s)
log() { echo "[t+$(($(date +%s) - START))s] $*" | tee -a "$OUT/leg.log"; }
for var in $(env | grep -o '^COMPATSHIM_[A-Z_]*'); do unset "$var"; done
unset PYTHONPATH  # the overlay says where everything comes from
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
unset PYTHONDONTWRITEBYTECODE  # bytecode is cached, in the scratch folder (below)

# 1. the overlay: a venv whose site-packages add the machine's, then the wheels and compatshim
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/compatshim-gpu-leg.XXXX")
VPY=$PY  # the overlay's interpreter once it is ready
RAN=()
DONE=
record() {  # GPU.md from what $OUT holds, then (GPU_PACK) every raw file in one archive
    [ -n "$DONE" ] || log "stopped before the end: the record covers what ran"
    COMMAND="bash matrix/gpu/leg.sh (GPU_WORKERS=$WORKERS GPU_TESTS=$TESTS GPU_SUITE_S=$SUITE_S; pytest ${PARALLEL[*]:-} ${COMMON[*]:-})"
    "$VPY" matrix/gpu/make_gpu_md.py --out "$OUT" --command "$COMMAND" --seconds "$(($(date +%s) - START))" \
        --benches "${RAN[*]:-}" --write matrix/GPU.md >/dev/null
    cp matrix/GPU.md "$OUT/GPU.md"
    log "record written; GPU.md in $OUT"
    if [ -n "${GPU_PACK:-}" ]; then
        (cd "$OUT" && find . -maxdepth 1 -type f ! -name GPU.md ! -name raw.tar.gz -printf '%P\n' \
            | tar -czf raw.tar.gz -T - && find . -maxdepth 1 -type f ! -name GPU.md \
            ! -name raw.tar.gz -delete) || echo "packing failed: the raw files stay in $OUT"
    fi
    rm -rf "$SCRATCH"
}
trap record EXIT
stop() {  # a signal: the suite beside us gets SIGINT (timeout passes it on), so pytest writes its
    # summary and junit file; 20 s at most, then the record
    log "stopped by a signal"
    if [ -n "${SUITE_PID:-}" ] && kill -INT "$SUITE_PID" 2>/dev/null; then
        for _ in $(seq 20); do kill -0 "$SUITE_PID" 2>/dev/null || break; sleep 1; done
        [ -f "$OUT/suite.rc" ] || echo 130 >"$OUT/suite.rc"
    fi
    exit 143
}
trap stop TERM INT HUP
# the ~100 interpreters the tests start compile what they import once, not each time (a tox env
# without it took 2.3x as long), and nothing is written into the machine's own site-packages
export PYTHONPYCACHEPREFIX=$SCRATCH/pycache
VENV=$SCRATCH/venv
"$PY" - "$VENV" <<'EOF' >"$OUT/overlay.txt" 2>&1 || { log "venv failed"; cat "$OUT/overlay.txt"; exit 2; }
import os, sys, sysconfig
try:
    import venv
    venv.EnvBuilder(with_pip=False, symlinks=True).create(sys.argv[1])
except Exception as exc:  # a distribution that split venv out: what venv writes, by hand
    print("venv module failed:", exc, "- writing pyvenv.cfg by hand")
    base = getattr(sys, "_base_executable", sys.executable)
    lib = sysconfig.get_path("purelib", vars={"base": sys.argv[1], "platbase": sys.argv[1]})
    os.makedirs(lib, exist_ok=True)
    os.makedirs(os.path.join(sys.argv[1], "bin"), exist_ok=True)
    os.symlink(base, os.path.join(sys.argv[1], "bin", "python"))
    with open(os.path.join(sys.argv[1], "pyvenv.cfg"), "w") as cfg:
        cfg.write(f"home = {os.path.dirname(base)}\ninclude-system-site-packages = false\n")
EOF
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PY" - "$SITE" "$ROOT" <<'EOF' >>"$OUT/overlay.txt" 2>&1 || { log "overlay failed"; exit 2; }
import re, shutil, sys
from pathlib import Path
target, root = Path(sys.argv[1]), Path(sys.argv[2])
# every site dir the machine's interpreter sees (its venv's, and the system's where it has them)
bases = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
# .pth files run in name order: this checkout's src first (so a compatshim the machine may have
# installed never shadows it), then the machine's site dirs with their own .pth files
(target / "00_compatshim_leg_1_src.pth").write_text(f"{root / 'src'}\n")
(target / "00_compatshim_leg_2_base.pth").write_text(
    "".join(f"import site; site.addsitedir({p!r})\n" for p in bases))
# the three start-up files, as an editable install of the wheel places them (its RECORD below
# lists them, so tests/core/test_startup_files.py checks them here as in a tox env)
HOOK = ("compatshim_auto.pth", "compatshim_auto.start", "compatshim_auto.py")
for name in HOOK:
    shutil.copyfile(root / "src" / name, target / name)
# the one version source (pyproject.toml's version is dynamic, read by hatch from here)
init = (root / "src" / "compatshim" / "__init__.py").read_text()
version = re.search(r'^__version__ = "([^"]+)"', init, re.M)[1]
info = target / f"compatshim-{version}.dist-info"
info.mkdir()
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: compatshim\nVersion: {version}\n")
(info / "INSTALLER").write_text("matrix/gpu/leg.sh\n")
own = (f"{info.name}/{part}" for part in ("METADATA", "INSTALLER", "RECORD"))
(info / "RECORD").write_text("".join(f"{name},,\n" for name in (*HOOK, *own)))
print("overlay over", bases)
EOF
# the wheels, unpacked as pip --target --no-deps would (the machine may have no pip)
"$PY" - "$SITE" .whl/*.whl <<'EOF' >>"$OUT/overlay.txt" 2>&1 || log "wheel install failed (see overlay.txt)"
import sys, zipfile
from pathlib import Path
target = Path(sys.argv[1])
for wheel in sys.argv[2:]:
    if not Path(wheel).is_file():
        print("no wheels in .whl/: ColossalAI tests skip unless the machine has it")
        continue
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            parts = Path(member.filename).parts
            if parts[0].endswith(".data"):  # only purelib/platlib; scripts, headers, data skipped
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            if member.is_dir():
                continue
            out = target.joinpath(*parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(archive.read(member))
    print("unpacked", wheel)
EOF
OVERLAY_PY=$VENV/bin/python
"$OVERLAY_PY" -c 'import compatshim, torch; print("compatshim from", compatshim.__file__, "torch", torch.__version__)' \
    >>"$OUT/overlay.txt" 2>&1 || { log "overlay python cannot import compatshim/torch"; cat "$OUT/overlay.txt"; exit 2; }
VPY=$OVERLAY_PY
log "overlay ready: $VPY"

# 1b. the doctor, the main job, as a user arms compatshim (before the suites load the machine)
COMPATSHIM_AUTO=1 timeout 120 "$VPY" -m compatshim doctor >"$OUT/doctor.txt" 2>&1
echo $? >"$OUT/doctor.rc"
log "doctor rc=$(cat "$OUT/doctor.rc")"

# 2. the suite (xdist where installed) and the gpu tests, side by side
PARALLEL=()
"$VPY" -c 'import xdist' 2>/dev/null && PARALLEL=(-n "$WORKERS") || log "no pytest-xdist: the suite runs in one process"
COMMON=(-p no:cacheprovider -q -rfEs --durations=15)
# tests/tooling's tox tests skip themselves with a reason where tox is not installed
# SIGINT first: pytest (and xdist) stop, print the summary and write the junit file
timeout -k 30 -s INT "$SUITE_S" "$VPY" -m pytest $TESTS -m "not gpu and not multigpu" "${PARALLEL[@]}" \
    "${COMMON[@]}" --junitxml="$OUT/suite.xml" >"$OUT/suite.txt" 2>&1 &
SUITE_PID=$!
timeout -k 30 -s INT "$SUITE_S" "$VPY" -m pytest $TESTS -m "gpu or multigpu" "${COMMON[@]}" -rA \
    --junitxml="$OUT/gpu.xml" >"$OUT/gpu_tests.txt" 2>&1
echo $? >"$OUT/gpu_tests.rc"
log "gpu tests rc=$(cat "$OUT/gpu_tests.rc")"
wait "$SUITE_PID"
echo $? >"$OUT/suite.rc"
log "suite rc=$(cat "$OUT/suite.rc") (124: stopped by its GPU_SUITE_S clock)"
tail -n 3 "$OUT/suite.txt" "$OUT/gpu_tests.txt"

# 3. the GPU benchmarks, each on its own clock; a bench this checkout lacks is left out
for name in $BENCHES; do
    [ -f "bench/$name.py" ] || { log "bench $name: not in this checkout, left out"; continue; }
    BENCH_QUICK=1 timeout -k 10 "$BENCH_S" "$VPY" bench/run_all.py "$name" >"$OUT/$name.txt" 2>&1
    echo $? >"$OUT/$name.rc"
    log "bench $name rc=$(cat "$OUT/$name.rc")"
    RAN+=("$name")
done
cp bench/RESULTS.md "$OUT/bench-RESULTS.md" 2>/dev/null

# 4. the record: written by record() on the way out (the EXIT trap above), so a leg stopped by a
# TERM, INT or HUP (a device tool's clock) still leaves GPU.md and, with GPU_PACK, raw.tar.gz
DONE=1
exit 0
