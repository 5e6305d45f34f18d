#!/usr/bin/env bash
# Run on a machine WITH a package index, from anywhere: fills .whl/ (git-ignored) with what the
# GPU machine (no index; Python 3.12, x86_64, torch 2.11+cu130, lightning, transformers,
# pytest-xdist, psutil, peft, einops present) lacks for the suite: ColossalAI 0.5.0 (an sdist
# only: built here into a pure-Python wheel, no CUDA kernels; they build on first use there),
# and galore-torch and bitsandbytes, which its import needs; omegaconf (with PyYAML), torchdata and
# zstandard at the matrix's pins, so the tests that need them run there too (they skipped on the
# 2026-12-06 run). matrix/gpu/leg.sh installs them
# into its overlay with --no-deps; carry `.whl` to the device with the checkout.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$ROOT/.whl"
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
# setuptools and wheel in a throwaway venv: --no-build-isolation uses the running interpreter's
python3 -m venv "$BUILD/venv"
"$BUILD/venv/bin/python" -m pip install -q "setuptools<81" wheel
"$BUILD/venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$ROOT/.whl" colossalai==0.5.0
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 \
    -d "$ROOT/.whl" galore-torch==1.0 bitsandbytes==0.50.2 omegaconf==2.4.0 pyyaml==6.0.4 \
    torchdata==0.11.0 zstandard==0.25.0
ls -la "$ROOT/.whl"
du -sh "$ROOT/.whl"  # the device tool carries at most 64 MiB with the tree
