"""Accuracy of the low-precision decode modes on two small trained byte-level LMs (issue 14).

Modules: ``data`` (the offline corpus), ``model`` (the two LMs and their parallel and decode paths),
``backends`` (the state backends a decode step calls: float64 reference, or replayssm's wrappers
in one of the modes), ``metrics`` (KL, agreement, divergence, perplexity), ``train``, ``evaluate``
and ``plot`` (scripts: ``python -m perf.accuracy.train ...`` from the repository root). README.md
says how to reproduce every number.
"""
