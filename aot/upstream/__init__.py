"""Build-time adapters for upstream kernel code (pinned, imported from the installed package).

Nothing in here is ever copied into this repository or shipped: the upstream classes are imported
from the pinned, installed distribution at build time and compiled by :mod:`aot.export`.
Where upstream has fixed a bug no release carries yet, :mod:`aot.upstream.patches` applies that fix
to the imported source text in memory (sha256-pinned, recorded in the manifest; PATCHES.md).
"""
