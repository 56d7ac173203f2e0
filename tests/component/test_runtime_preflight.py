"""The preflight (pipelines/promote/preflight.py, the seam's phase "preflight"): the runtime gate
judges every replica and the plan's model files once per promotion, after convert and before the
upload and any load (issue 49 item 4: "an ONNX model with an opset beyond the replica's ONNX
Runtime refused before any load, naming both versions").

The world of tests/unit/worlds.py: a real local store, fake Tritons answering ServerMetadata with
Triton 2.51.0 (container 24.10, ONNX Runtime 1.19.2: opset <= 21) and recording every load, the
registry port's fake.  The candidate is ``net`` v2 registered as a real ONNX file (onnx.helper).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from pipelines.checks.runtime import RuntimeSettings
from pipelines.checks.runtime_tables import HAZARDS
from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionFailed, PromotionResult
from pipelines.promote.runner import Promotion
from registry.manifest import artifact_digest
from tests.unit.worlds import World

ONNX_NET = """name: "net"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "MID" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
# production's policy, every hazard of the fakes' 2.51.0 accepted: the model's opset is what refuses
REFUSE = RuntimeSettings(policy="refuse", accept=frozenset(h.id for h in HAZARDS))
TOO_NEW = "model opset 23 > 21: ONNX Runtime 1.19.2 of Triton 2.51.0 (container 24.10) supports up to"


def _world(tmp_path: Path, opset: int = 23, settings: RuntimeSettings | None = None) -> World:
    """``ens`` v1 serving; ``net`` v2 registered as an ONNX file of ``opset`` (IR 10)."""
    world = World(tmp_path)
    world.promote("ens", "1")
    world.registry.add("net", "2", ONNX_NET)
    folder = world.registry.root / "net" / "2"
    (folder / "model" / "model.py").unlink()
    x = helper.make_tensor_value_info("MID", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("OUT", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Identity", ["MID"], ["OUT"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.save(model, folder / "model" / "model.onnx")
    digest = artifact_digest(folder / "model", folder / "config.pbtxt")
    world.registry.tags[("net", "2")]["artifact_digest"] = digest
    if settings is not None:
        world.env = dataclasses.replace(world.env, checks=(("runtime", settings),))
    world.events.clear()
    return world


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _state(world: World) -> dict[str, Any]:
    """Every object of the store, byte for byte; what each replica holds; every alias and tag."""
    return {
        "store": _files(world.store_root),
        "serving": {url: t.model_states() for url, t in world.fleet.targets.items()},
        "pins": {url: dict(t.ensembles) for url, t in world.fleet.targets.items()},
        "aliases": {m: world.registry.models.aliases(m) for m in ("pre", "net", "ens")},
        "tags": {k: dict(v) for k, v in world.registry.tags.items()},
    }


def _promotion(world: World, **options: Any) -> Promotion:
    return Promotion(
        world.settings,
        world.env,
        world.registry,
        Options(**{"skip_quality": True} | options),
        connect=world.fleet.connect,
    )


def _runtime(result: PromotionResult | dict[str, Any]) -> list[dict[str, Any]]:
    verdicts = result["verdicts"] if isinstance(result, dict) else result.verdicts
    return [v for v in verdicts if v["name"] == "runtime"]


def test_an_onnx_opset_beyond_the_replicas_onnx_runtime_is_refused_before_anything_changes(
    tmp_path: Path,
) -> None:
    world = _world(tmp_path, settings=REFUSE)
    before = _state(world)
    promotion = _promotion(world)
    with pytest.raises(PromotionFailed) as info:
        promotion.run("net", "2")
    message = info.value.message
    assert "refused before any load (preflight)" in message
    assert f"net/2: {TOO_NEW}" in message  # both versions: the model's opset and the replica's ORT
    assert "Triton >= 2.60.0" in info.value.fix  # the release whose ONNX Runtime loads it
    assert _state(world) == before  # the store byte for byte, the replicas, every alias and tag
    assert world.loads() == []  # no replica received a load
    assert world.events == []  # nor an unload, nor a registration, nor an alias move
    assert promotion.ctx is not None
    stages = [(s.stage, s.status) for s in promotion.ctx.result.stages]
    assert stages[-1] == ("preflight", "failed")
    assert "assemble" not in dict(stages)  # nothing uploaded
    [refusing] = [v for v in _runtime(promotion.ctx.result) if v["refuses"]]
    assert refusing["subject"] == "model net/2 ONNX"
    assert refusing["replicas"] == ["t0:8001", "t1:8001"]  # every replica judged, not the canary alone
    assert refusing["window"] == "before any load (preflight)"
    run = world.registry.recorded[-1]  # the attempt is recorded, its verdict with it
    assert run["tags"]["result"] == "refused"


def test_the_same_candidate_at_a_supported_opset_passes_the_refusing_policy(tmp_path: Path) -> None:
    world = _world(tmp_path, opset=21, settings=REFUSE)  # the positive control: opset 21 <= 21
    result = world.promote("net", "2")
    [model] = [v for v in _runtime(result) if v["subject"] == "model net/2 ONNX"]
    assert model["result"] == "pass"
    assert serving_versions(world.config("net") or "") == ["2"]


def test_the_default_policy_promotes_it_and_records_would_have_refused(tmp_path: Path) -> None:
    world = _world(tmp_path)  # policy "note", the default
    result = world.promote("net", "2")
    assert serving_versions(world.config("net") or "") == ["2"]  # promoted
    assert any(e[0] == "load" and e[2] == "net" and "2" in e[3] for e in world.events)
    [model] = [v for v in _runtime(result) if v["subject"] == "model net/2 ONNX"]
    assert (model["result"], model["observed"], model["refuses"]) == ("fail", True, False)
    assert model["note"] == "observed: would have refused"
    assert TOO_NEW in model["why"]
    assert [r for r in _runtime(result) if r["subject"] == "model net/2 ONNX"] == [model]  # judged once


def test_skip_runtime_records_it_skipped_and_promotes(tmp_path: Path) -> None:
    world = _world(tmp_path, settings=REFUSE)
    result = world.promote("net", "2", skip=frozenset({"runtime"}))
    assert [(v["result"], v["why"]) for v in _runtime(result)] == [("skipped", "skipped (--skip runtime)")]
    assert serving_versions(world.config("net") or "") == ["2"]


def test_an_observed_runtime_check_would_have_refused_and_promotes(tmp_path: Path) -> None:
    world = _world(tmp_path, settings=REFUSE)
    world.env = dataclasses.replace(world.env, observe=("runtime",))
    result = world.promote("net", "2")
    [model] = [v for v in _runtime(result) if v["subject"] == "model net/2 ONNX"]
    assert (model["observed"], model["refuses"], model["note"]) == (
        True,
        False,
        "observed: would have refused",
    )
    assert serving_versions(world.config("net") or "") == ["2"]


def test_a_dry_run_runs_the_preflight_and_changes_nothing(tmp_path: Path) -> None:
    world = _world(tmp_path, settings=REFUSE)
    before = _state(world)
    with pytest.raises(PromotionFailed, match="refused before any load"):
        _promotion(world, dry_run=True).run("net", "2")
    assert _state(world) == before
    assert world.loads() == []


def test_with_the_gate_on_the_runtime_check_runs_once_before_it(tmp_path: Path) -> None:
    world = _world(tmp_path)
    result = _promotion(world, skip_quality=False).run("net", "2")  # the canary gate runs too
    found = _runtime(result)
    assert {v["window"] for v in found} == {"before any load (preflight)"}
    assert [v["subject"] for v in found] == ["hazards", "model net/2 ONNX"]  # one judgement per promotion
    assert [v["name"] for v in result.verdicts][: len(found)] == ["runtime"] * len(found)  # the gate's after
    assert any(v["name"] == "golden" for v in result.verdicts)
