"""Promotion: a registered version to serving in an environment, checked, swapped, recorded.

This package is the engine (issue 47): the runner and its stages, the gates, failure and record,
the environments loader and what the engine runs around a promotion (integrity, convert, litter,
stamps, retention, after, plots; the status query is the application's: mlreg/ops/status.py). Its
vocabulary is ``pipelines.core``; what it plugs together lives beside it: ``pipelines.checks``,
``guards``, ``rollout``, ``fleet``, ``triton``.
"""
