#!/usr/bin/env bash
# The checkpoints PyTorch Lightning's own legacy scripts write when they train on CPU (Lightning's
# code, not committed here). Lightning < 1.5 keys each callback's state by the callback's class.
#
# pl-1.4.9.ckpt: tag 1.4.9, legacy/simple_classif_training.py (a 24-feature classifier,
#   EarlyStopping on val_acc, the default ModelCheckpoint). Made 2026-11-27 with Python 3.8.18,
#   torch 1.13.1, torchmetrics 0.5.1, scikit-learn, numpy < 1.24 (Lightning's script of that
#   tag pinned torch 1.6; 1.13.1 writes the same zip format).
# pl-1.0.8.ckpt: pytorch_lightning 1.0.8 running legacy/zero_training.py of tag 1.1.8 (1.0 has
#   no legacy folder; 1.1-1.3 made their fixtures with this script and torch 1.4): a Linear(32, 2)
#   with SGD and StepLR, the default ModelCheckpoint. Made 2026-11-27 with Python 3.8.18 and
#   torch 1.4.0, whose torch.save writes the legacy (non-zip) format.
#
#   tests/zoo/lightning_fixtures/make_fixture.sh RELEASE LIGHTNING_CLONE PYTHON3.8 OUT_DIR
set -eu
release=$1; clone=$2; python=$3; out=$(mkdir -p "$4" && cd "$4" && pwd)
work=$(mktemp -d)
case $release in
  1.4.9)
    git -C "$clone" archive 1.4.9 legacy | tar -x -C "$work"
    script=legacy/simple_classif_training.py
    deps=("pytorch_lightning==1.4.9" "torch==1.13.1" "torchmetrics==0.5.1" scikit-learn) ;;
  1.0.8)
    git -C "$clone" archive 1.1.8 legacy | tar -x -C "$work"
    script=legacy/zero_training.py
    deps=("pytorch_lightning==1.0.8" "torch==1.4.0") ;;
  *) echo "unknown release $release (1.0.8 or 1.4.9)" >&2; exit 2 ;;
esac
uv venv -q -p "$python" "$work/venv"
VIRTUAL_ENV=$work/venv uv pip install -q "${deps[@]}" "numpy<1.24" "setuptools<60" "protobuf<4" six
(cd "$work" && "$work/venv/bin/python" "$script")
cp "$work"/legacy/checkpoints/"$release"/lightning_logs/version_0/checkpoints/*.ckpt \
  "$out/pl-$release.ckpt"
rm -rf "$work"
