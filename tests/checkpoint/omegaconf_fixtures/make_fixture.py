"""Write ``omegaconf-<version>.pkl``: hyper-parameters pickled by that omegaconf release.

Run with the release to record installed, e.g. omegaconf 2.0.6 (Lightning 1.x era):
``python make_fixture.py``. The file is loaded by tests/checkpoint/test_omegaconf.py
under every newer release and compared with omegaconf's own unpickling.
"""

from __future__ import annotations

import pathlib
import pickle

import omegaconf
from omegaconf import OmegaConf

cfg = OmegaConf.create(
    {
        "lr": 0.1,
        "model": {"name": "tiny", "layers": [1, 2, {"ref": "${lr}"}]},
        "alias": "${model.name}",
    }
)
path = pathlib.Path(__file__).with_name(f"omegaconf-{omegaconf.__version__}.pkl")
path.write_bytes(pickle.dumps({"hparams": cfg}, protocol=2))
print(path)
