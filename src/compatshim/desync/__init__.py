"""Desync detection: the code behind :mod:`compatshim.dist`, which holds the public names.

One job per module (docs/desync.md, "where things live"). The folder is not called
``dist``: ruff's default ``exclude`` and other tools skip a folder of that name as
build output. Importing it imports no framework; torch is imported on first use.
"""
