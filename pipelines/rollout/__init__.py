"""Deployers: how a version reaches an environment's replicas (all at once, staged in waves) and the probes
that watch a wave. A deployer may import pipelines.core, pipelines.fleet, pipelines.triton and the
checks and guards it runs; the engine (pipelines.promote) picks one."""
