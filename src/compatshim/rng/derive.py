"""Deterministic derived states for generators the saved material has no entry for.

A derived state is seeded by a hash of the saved material and a purpose label
("rank:3", "cuda:6"), so the same checkpoint always derives the same streams,
and two labels give unrelated 64-bit seeds: derived ranks and devices never
replay each other's stream nor a restored one.
"""

from __future__ import annotations

import hashlib
import random
import struct
from typing import Any

from .state import MT_WORDS, NumpyMT, Parts, captured_position


def material_digest(parts: Parts) -> bytes:
    """A digest of every saved generator in ``parts`` (the seed material)."""
    digest = hashlib.blake2b(b"compatshim.rng/1", digest_size=32)
    if parts.python is not None:
        digest.update(struct.pack(f"<{len(parts.python[1])}Q", *parts.python[1]))
    if parts.numpy is not None:
        digest.update(struct.pack(f"<{MT_WORDS}Q", *parts.numpy.key))
        digest.update(struct.pack("<q", parts.numpy.pos))
    for tensor in [parts.torch_cpu, *parts.cuda, *parts.xpu, parts.mps]:
        if tensor is not None:
            digest.update(bytes(tensor.numpy().tobytes()))
    return digest.digest()


def capture_digest(parts: Parts) -> str:
    """What ``capture()`` records as ``meta["digest"]``: its generators, cached gaussians and
    position bound together, so a state assembled from several ranks' captures (DCP keeps one
    rank's copy of each value every rank saves under one key) is told from one capture."""
    digest = hashlib.blake2b(material_digest(parts), digest_size=16)
    gauss = parts.python[2] if parts.python is not None else None
    cached = (parts.numpy.has_gauss, parts.numpy.cached_gaussian) if parts.numpy else None
    position = captured_position(parts)  # ints or None: nothing a file put in meta is repr()'d
    digest.update(repr((gauss, cached, position)).encode())
    return digest.hexdigest()


def one_capture(parts: Parts) -> bool:
    """False where ``parts`` captured in a process group do not match their capture digest;
    True without one (states of earlier releases and other writers) or a recorded rank."""
    recorded = parts.meta.get("digest")
    if not isinstance(recorded, str) or captured_position(parts)[0] is None:
        return True
    return recorded == capture_digest(parts)


def derived_seed(digest: bytes, purpose: str) -> int:
    """A 63-bit seed for ``purpose`` from ``digest`` (63 bits: torch seeds must fit in int64)."""
    raw = hashlib.blake2b(digest + b"/" + purpose.encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") >> 1


def derived_python(seed: int) -> tuple[int, tuple[int, ...], float | None]:
    version, internal, gauss = random.Random(seed).getstate()
    return version, tuple(internal), gauss


def derived_numpy(seed: int) -> NumpyMT:
    """An MT19937 key built by Python's own MT seeding: no numpy import needed."""
    internal = random.Random(seed).getstate()[1]
    return NumpyMT(key=tuple(internal[:MT_WORDS]), pos=MT_WORDS, has_gauss=0, cached_gaussian=0.0)


def derived_cpu(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(seed).get_state()


def derived_cuda(seed: int) -> Any:
    """A CUDA (Philox) generator state: seed and offset 0, the layout of torch >= 2.1."""
    import torch

    return torch.tensor(list(struct.pack("<QQ", seed, 0)), dtype=torch.uint8)


def derived_parts(digest: bytes, purpose: str, saved: Parts, cuda: int) -> Parts:
    """Every generator derived for ``purpose`` (a rank the checkpoint does not have).

    XPU and MPS layouts are backend-defined, so they are never invented here.
    """
    parts = Parts(
        python=derived_python(derived_seed(digest, f"{purpose}/python")),
        numpy=derived_numpy(derived_seed(digest, f"{purpose}/numpy")),
        torch_cpu=derived_cpu(derived_seed(digest, f"{purpose}/torch_cpu")),
        cuda=[derived_cuda(derived_seed(digest, f"{purpose}/cuda:{d}")) for d in range(cuda)],
        meta=dict(saved.meta),
    )
    return parts
