#!/usr/bin/env bash
# pl-1.4.9.ckpt: the checkpoint PyTorch Lightning 1.4.9 writes when its own legacy script
# (tag 1.4.9, legacy/simple_classif_training.py: a 24-feature classifier, EarlyStopping on
# val_acc, the default ModelCheckpoint; Lightning's code, not committed here) trains on CPU.
# Lightning < 1.5 keys each callback's state by the callback's class. Made 2026-11-27 with
# Python 3.8.18, torch 1.13.1 (the oldest torch the package index has; Lightning's own
# fixtures used 1.6), torchmetrics 0.5.1, scikit-learn, numpy < 1.24:
#
#   tests/zoo/lightning_fixtures/make_fixture.sh LIGHTNING_CLONE PYTHON3.8 OUT_DIR
set -eu
clone=$1; python=$2; out=$(mkdir -p "$3" && cd "$3" && pwd)
work=$(mktemp -d)
git -C "$clone" archive 1.4.9 legacy | tar -x -C "$work"
uv venv -q -p "$python" "$work/venv"
VIRTUAL_ENV=$work/venv uv pip install -q "pytorch_lightning==1.4.9" "torch==1.13.1" \
  "torchmetrics==0.5.1" "numpy<1.24" scikit-learn "setuptools<60" "protobuf<4" six
(cd "$work" && "$work/venv/bin/python" legacy/simple_classif_training.py)
cp "$work"/legacy/checkpoints/1.4.9/lightning_logs/version_0/checkpoints/*.ckpt "$out/pl-1.4.9.ckpt"
rm -rf "$work"
