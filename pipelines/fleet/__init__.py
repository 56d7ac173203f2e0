"""An environment's servers: the Fleet (the one owner of moves onto replicas and their restore), the
replicas, their discovery and restarts. It may import pipelines.core, pipelines.triton and
pipelines.storage; "fleet" means only this (the GitOps desired-state file is mlreg.ops.fleet_pins)."""
