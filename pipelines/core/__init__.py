"""The promotion's shared vocabulary: the context a promotion carries, the plan, the reports, the undo log,
the rollout policy and the ports (the Protocols the engine talks to). It is the floor of the promotion:
the engine (pipelines.promote) and every feature package (checks, guards, rollout, fleet, triton) may
import it; it is meant to import no feature package (the cycles it still closes with features go with
issue 47's seams)."""
