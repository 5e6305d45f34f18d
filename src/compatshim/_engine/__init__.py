"""The patch engine: how a patch is declared, armed on import, decided, applied and reverted.

``patch`` (the declaration), ``registry`` (install/uninstall/status: gate,
probe, apply, confirm), ``import_hooks`` (post-import hooks), ``patching``
(every change recorded for an exact revert), ``versions`` (installed versions
from metadata, never by import), ``decisions`` (the decision trail and
warnings that cannot raise). The catalogue it runs is
:data:`compatshim.patches.CATALOGUE`. Nothing here imports a framework.
"""
