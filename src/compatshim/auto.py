"""``import compatshim.auto`` arms every applicable patch (same as ``compatshim.install()``)."""

from ._registry import install

install()
