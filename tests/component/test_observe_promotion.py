"""Issue 49 item 2, through a whole promotion: an environment observing ``shadow`` promotes a
candidate the replay would refuse and records "observed: would have refused" with the same figures
as an enforcing environment on the same captures.

The world of tests/unit/worlds.py (the real engine end to end: a real local store, fake Tritons,
the registry port's fake): ``m`` v1 serves and answers sum(x); the 80 captured production requests
(Triton trace files, one folder both environments replay) are answered 5 x sum(x) by the candidate
v2.  The enforcing environment refuses it and leaves everything as it was; the observing one
promotes it (the store, both replicas and the alias move to v2).  The two verdicts are read from
the ``--json`` document and the run's ``verdict.json`` alike.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlreg.cli import promote_render
from mlreg.cli.sink import Output
from pipelines.checks.capture import Shadow
from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionFailed
from pipelines.promote.runner import Promotion
from tests.unit.trace_files import CONFIG as TRACED
from tests.unit.trace_files import write_honest
from tests.unit.worlds import World

CAPTURED = 80
SCALE = 5.0  # the candidate answers 5 x what the serving version answers: every request diverges
# the gate's other checks are not what is judged here (golden's expectation suite takes seconds to import)
OPTIONS = Options(skip=frozenset({"golden", "perf"}))
# what marks a record observed; every other field is the measurement and must be equal
MARKS = ("observed", "refuses", "note")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _state(world: World) -> dict[str, Any]:
    """What a refusal must leave alone (the unit world's refusal_state): every object of the store
    byte for byte, what each replica serves and its pins, every alias and version tag."""
    return {
        "store": _files(world.store_root),
        "serving": {url: t.model_states() for url, t in world.fleet.targets.items()},
        "pins": {url: dict(t.ensembles) for url, t in world.fleet.targets.items()},
        "aliases": {m: world.registry.models.aliases(m) for m in ("pre", "net", "ens", "m")},
        "tags": {k: dict(v) for k, v in world.registry.tags.items()},
    }


def _world(root: Path, captures: Path, observe: tuple[str, ...]) -> World:
    """``m`` v1 serving on both replicas, v2 registered (5 x its answers); ``observe`` the
    environment's list; ``captures`` the production traffic it replays."""
    root.mkdir()
    world = World(root)
    world.registry.add("m", "1", TRACED)
    world.promote("m", "1")
    world.registry.add("m", "2", TRACED)
    world.env = dataclasses.replace(
        world.env, shadow=Shadow(captures=str(captures), count=500), observe=observe
    )
    for url in world.env.targets:
        target = world.fleet.connect(url)
        infer = target.infer

        def scaled(model: str, inputs: Any, outputs: list[str], version: str = "", _i: Any = infer) -> Any:
            if not model.startswith("m"):
                return _i(model, inputs, outputs, version)
            scale = SCALE if version == "2" else 1.0
            return {"Y": (np.asarray(inputs["X"]).sum(axis=1, keepdims=True) * scale).astype(np.float32)}

        target.infer = scaled  # type: ignore[method-assign]
    world.events.clear()
    return world


def _promote(
    world: World, capsys: pytest.CaptureFixture[str]
) -> tuple[PromotionFailed | None, dict[str, Any]]:
    """``m`` v2 promoted as ``mlreg promote --json`` does it: the error (None: promoted) and the
    JSON document printed."""
    capsys.readouterr()
    promotion = Promotion(world.settings, world.env, world.registry, OPTIONS, connect=world.fleet.connect)
    out, error = Output(True), None
    try:
        result = promote_render.promotion(out, lambda: promotion.run("m", "2"))
        promote_render.render(out, result, world.env.alias)
    except PromotionFailed as exc:
        error = exc
    return error, json.loads(capsys.readouterr().out)


def _shadow(document: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The one shadow record of ``document``, the same in the run's verdict.json."""
    [found] = [v for v in document["verdicts"] if v["name"] == "shadow"]
    assert json.loads(run["artifacts"]["verdict.json"]) == document["verdicts"]
    return found


def test_an_observed_shadow_replay_promotes_what_the_enforced_one_refuses_with_the_same_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    captures = tmp_path / "traces"
    written = write_honest(captures, CAPTURED)
    enforcing = _world(tmp_path / "enforce", captures, ())
    observing = _world(tmp_path / "observe", captures, ("shadow",))

    before = _state(enforcing)
    refused, document = _promote(enforcing, capsys)
    assert refused is not None
    assert document["outcome"] == "refused"
    assert _state(enforcing) == before  # store, replicas, pins, aliases, tags: as they were
    assert "nothing was changed" in refused.message
    # the canary judged it (v2 loaded beside v1, then taken back); no other replica was sent a load
    assert {e[1] for e in enforcing.loads()} == {"t0:8001"}
    enforced = _shadow(document, enforcing.registry.recorded[-1])
    assert (enforced["result"], enforced["observed"], enforced["refuses"]) == ("fail", False, True)
    assert document["reason"].startswith("shadow m v2: fail")
    assert "note" not in enforced

    promoted, document = _promote(observing, capsys)
    assert promoted is None
    assert document["outcome"] == "promoted"
    assert document["reason"] == ""  # an observed check is never the promotion's reason
    assert serving_versions(observing.config("m") or "") == ["2"]  # the store's config serves v2
    for target in observing.fleet.targets.values():
        assert target.model_states()["m"] == {"2": "READY"}  # both replicas serve the candidate
    assert observing.registry.models.aliases("m")["test"] == "2"  # the environment's alias moved
    assert enforcing.registry.models.aliases("m")["test"] == "1"  # where the enforced refusal left it
    assert observing.registry.recorded[-1]["ok"] is True
    noted = _shadow(document, observing.registry.recorded[-1])
    assert (noted["result"], noted["observed"], noted["refuses"]) == ("fail", True, False)
    assert noted["note"] == "observed: would have refused"

    # the same captures, the same judgement: every figure equal, only the marks differ
    assert (noted["value"], noted["threshold"], noted["sample"], noted["noise_floor"]) == (
        float(CAPTURED),
        pytest.approx(0.4),
        CAPTURED,
        0.0,
    )
    assert {k: v for k, v in noted.items() if k not in MARKS} == {
        k: v for k, v in enforced.items() if k not in MARKS
    }
    assert _files(captures) == written  # both replayed the very same captured requests
