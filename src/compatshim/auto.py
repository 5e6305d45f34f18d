"""``import compatshim.auto`` arms every applicable patch (same as ``compatshim.install()``)."""

from ._engine.registry import install

install()
