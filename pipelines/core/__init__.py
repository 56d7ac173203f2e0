"""The promotion's shared vocabulary: the context a promotion carries, the plan, the reports, the undo log,
the rollout policy, the change vocabulary a fleet and the undo log share (changes.py) and the ports (the
Protocols the engine talks to: the servers too, as ``Servers`` and ``Replicas``). It is the floor of the
promotion: the engine (pipelines.promote) and every feature package (checks, guards, rollout, fleet,
triton) may import it; it imports no feature package (tests/component/test_layers.py)."""
