"""Promotion: a registered version to serving in an environment, checked, swapped, recorded."""
