"""Talking to one Triton Inference Server: its control API (control), the key that locks it (control_key),
its metrics and the gauges read from them. It imports no other part of the promotion: every package
above may use it."""
