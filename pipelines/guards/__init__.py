"""Load guards: what must hold before a model is loaded onto a replica (memory headroom, warmup requests),
one module each (a part of one beside it: headroom_findings.py, what the headroom guard found). A guard
may import pipelines.core, pipelines.fleet and pipelines.triton; the engine calls the guards."""
