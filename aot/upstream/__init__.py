"""Build-time adapters for upstream kernel code (pinned, imported from the installed package).

Nothing in here is ever copied into this repository or shipped: the upstream classes are imported
from the pinned, installed distribution at build time and compiled by :mod:`aot.export`.
"""
