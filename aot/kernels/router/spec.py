"""The build's name for the router's method and pooled-cell layout: every public name of
``python/subblock_sage/router_spec.py``, loaded once as ``aot.runtime.router_spec``
(``aot/runtime/__init__.py`` says how and why). One definition of each constant: that file."""

from __future__ import annotations

from aot.runtime.router_spec import *  # noqa: F401,F403
