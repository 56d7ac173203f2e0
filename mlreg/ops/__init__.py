"""One module per user verb (dvc's ``dvc/repo/<verb>.py`` shape).

Each ``mlreg/ops/<verb>.py`` holds the work of one verb -- ``promote``, ``promote_many``,
``rollback``, ``status`` (its query in ``status_views``, ``status_replicas``, ``status_rows``),
``history``, ``retire``, ``predict``, ``store_gc``, ``store_verify``, ``store_ls``, ``store_push``,
``store_unlock``, ``store_repair``, ``store_init``, ``export``, ``register``, ``sign``,
``k8s_annotations``, ``shadow``, ``init``, ``ledger``, ``validate`` (and ``diff``), ``versions``
(``show``, ``alias``), ``stack``, ``triton``, ``template``, ``fleet_pins`` (``fleet pin|sync``: the
GitOps desired-state file), ``analysis`` (the bake's checks for Argo Rollouts and Kargo) --
composing the registry (MLflow) with the pipelines (store, servers) and returning a typed result.
The callers only parse, call and render: the CLI (``mlreg/cli/*``), the MLflow deployments plugin
(``mlreg/deployments.py``) and the relay (``mlreg/relay``).  :mod:`mlreg.ops.context` builds what
every verb starts from (the environment, its registry, its fleet and its store); the one lock
policy is :mod:`pipelines.storage.locking` (a promotion's stages and the retention sweep use it
too).

This package imports nothing heavy: each verb module imports what it needs when it is called.
"""
