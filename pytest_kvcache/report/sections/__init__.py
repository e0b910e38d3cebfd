r"""The report's features, one module each: a module declares its :class:`~pytest_kvcache.report.part.ReportPart`\ s
(``PARTS``) — the keys it adds to report.json (``section(run: RunData, ctx: BuildContext) -> dict``, none to leave
itself out; it reads the loaded run and the build's shared facts, ``ctx.deltas``, ``ctx.boots`` …, and another
section's keys with ``ctx.of(other.section)``) and its renderers in report.md, report.html and the terminal, each
with its place there. :mod:`pytest_kvcache.report.part` finds them by walking this package: a new feature is one
module here — or, from outside the package, one ``part.register`` call.
"""
