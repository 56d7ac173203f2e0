"""Load guards: what must hold before a model is loaded onto a replica (memory headroom, warmup requests),
one module each. A guard may import pipelines.core, pipelines.fleet and pipelines.triton; the engine
calls the guards."""
