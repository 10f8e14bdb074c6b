"""Startup diagnostics: is this machine fully served, and if not, what exactly is the fix?

    report.py  the structured report (:class:`report.Report`, JSON via ``to_dict``)
    probes.py  what is inspected and run: :func:`probes.check` (never raises for a bad machine)
               and :func:`probes.validate_startup` (raises one error listing every problem)
    format.py  the text ``subblock-sage check`` prints

``subblock_sage.check`` / ``subblock_sage.validate_startup`` are the functions in ``probes``.
"""
