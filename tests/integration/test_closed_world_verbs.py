"""Issue 44 (H1b), a variant verb: ``mlflow deployments update -t mlreg`` (mlreg/deployments.py) refuses
the promote test's plant (``net/1.py`` beside the version folders) before any load.  No server: it
is here only because the plugin module imports MLflow (1.5 s), which unit tests may not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.worlds import MEMBER, World


def _deployed(tmp_path: Path) -> World:
    world = World(tmp_path)
    world.promote("ens", "1")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.events.clear()
    return world


def test_mlflow_deployments_refuses_a_planted_entry_before_any_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mlflow deployments update -t mlreg`` runs the same promotion: the plant refuses it, nothing
    is loaded, the store's config is as it was.  (The MLflow client and the environment are the
    unit world's: its registry and replicas stand in for the project's MLflow and stack.)"""
    from types import SimpleNamespace

    from mlflow.exceptions import MlflowException

    import mlreg.ops.context
    import mlreg.ops.promote
    from mlreg.deployments import MlregDeploymentClient

    world = _deployed(tmp_path)
    (world.store_root / "net" / "1.py").write_text("print('PLANTED')\n")
    before = world.config("net")
    monkeypatch.setattr(
        mlreg.ops.context,
        "context",
        lambda settings, env: SimpleNamespace(env=world.env, registry=world.registry),
    )
    monkeypatch.setattr(
        mlreg.ops.promote,
        "promote",
        lambda settings, env, name, version, options=None, registry=None: world.promote(name, version),
    )
    client = MlregDeploymentClient("mlreg:/test")
    with pytest.raises(MlflowException, match=r"net/1\.py lies beside the version folders"):
        client.update_deployment("net", "models:/net/2")
    assert world.loads() == []
    assert world.config("net") == before
    assert not (world.store_root / "net" / "2").exists()
