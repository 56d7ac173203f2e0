"""``mlreg relay``: MLflow alias moves followed by environments, exactly once (issue 50).

- :mod:`mlreg.relay.wire`: an MLflow webhook delivery verified (HMAC over the raw bytes, timestamp
  window) and parsed (bounded, allow-listed) into an :class:`~mlreg.relay.wire.AliasEvent`.
- :mod:`mlreg.relay.config`: ``[environments.E] follows = "champion"`` and the ``[relay]`` table.
- :mod:`mlreg.relay.queue`: the durable queue (sqlite under ``.mlreg/relay/``): delivery ids seen,
  pending deployments, events, refusals -- it survives a restart.
- :mod:`mlreg.relay.record`: the version last deployed per (environment, model) and the one before it
  (the rollback target the event does not carry), an object in the environment's store.
- :mod:`mlreg.relay.actions`: what a deployment is: an in-process ``mlreg promote``, a GitHub
  ``workflow_dispatch`` of promote.yml, or of gitops-pr.yml (the ``fleet pin`` pull request).
- :mod:`mlreg.relay.core`: receive, act (under the store's lock), reconcile.
- :mod:`mlreg.relay.app` / :mod:`mlreg.relay.serve`: the ASGI receiver and the process.
"""
