"""What judges a candidate before or during traffic: golden outputs, perf, shadow replay with its capture
and traces, the bake analysis and the offline checks, one module each. A check may import
pipelines.core, pipelines.triton and pipelines.storage; the engine (pipelines.promote) calls the checks,
not the other way round (the edges that remain go with issue 47's Check seam)."""
