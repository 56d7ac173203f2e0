"""The promotion's stages, each a function of the context that returns its report.

Planning (before the first live stage: a dry run stops there): ``resolve``, ``convert``,
``validate`` and the scratch-server gate.  Live (they write the store, the servers or the
registry, and note every change in ``ctx.undo`` first): ``assemble``, the canary gate, the
deployer's ``deploy`` and ``finalize``, ``verify`` and ``record``.

One number (issue 48, item 5): the version a client asks Triton for is the version MLflow shows.
A member's promotion re-points every ensemble over it.  Each re-pointed config is validated in
``validate`` and registered by ``deploy`` before its roll-out (``numbered``/``number_repointed``):
after every stage that can refuse without loading the ensemble -- the preflight, the quality gate
with its perf and shadow checks -- so a refused promotion never writes MLflow, and before anything
loads the ensemble.  The ensemble then moves to the Triton folder of that number, fetched from the
registry like any version (``config.pbtxt`` + an empty version folder), uploaded, verified and
swapped in like any version; an identical config reuses its version.  The plan (and a dry run)
names the folder that serves; from ``deploy`` on, the step is the registered version.  An exit
after the registration (an abort, a signal, a failed load or record) deletes the versions this
promotion made through the undo log (``pipelines/core/undo.py``), once each is proven its own: its
``OWNER_TAG`` names this promotion's id, set in the call that created it (a version reused, made
by anyone else, never carries it), no alias names it and nothing serves it.  Migration of a store
made before (an ensemble served from a folder whose number is not its registered version): the
next promotion that touches the ensemble moves it to its own number -- a member's promotion
re-points it, and ``mlreg promote ENSEMBLE --version N`` is no longer a no-op while folder != N;
once they agree it is (idempotent), and the old folder serves until the swap (nothing served is
lost).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import numpy as np

from pipelines.checks import golden as quality
from pipelines.checks import offline
from pipelines.core.litter import forget_uploads, note_upload, remove_fenced_uploads
from pipelines.core.plan import (
    Plan,
    Role,
    Step,
    build_plan,
    config_facts,
    desired_config,
    ensemble_pins,
    ensembles_pinning,
    fetch_version,
    serving_versions,
    swap_notes,
)
from pipelines.core.ports import ServingTarget
from pipelines.core.reports import (
    ConvertReport,
    NoopReport,
    RecordReport,
    RepairReport,
    ResolveReport,
    StageReport,
    UploadReport,
    ValidateReport,
    VerifyReport,
)
from pipelines.core.undo import OWNER_TAG
from pipelines.core.warmup import WARMUP_BYTES, peak_bytes
from pipelines.fleet.context import FleetContext
from pipelines.fleet.fleet import checkpoint, refuse_pending_loads
from pipelines.fleet.replicas import open_control_notes
from pipelines.fleet.restarts import not_ready_after_rollout
from pipelines.ledger.mirror import mirror
from pipelines.promote import retention
from pipelines.promote.convert import Converted, convert_step, needs_onnx, register_converted
from pipelines.promote.integrity import (
    apply_repair,
    check_signatures,
    check_stored,
    no_way_back_error,
    publish_signature,
    registered_differences,
)
from pipelines.promote.record import RecordWrites, failed_record, record_promotion, repair_record
from pipelines.promote.stamps import hold_repair_locks, repair_ensemble_stamps, repair_lock_names
from pipelines.promote.verdicts import peak_verdict
from pipelines.rollout.all_at_once import check_serves_from_store
from pipelines.storage import locking
from registry.contracts.config import CONFIG_NAME, parse_config
from registry.errors import MlregError, PromotionError, RegistryError, StorageError
from registry.lineage import deployment_stamp
from registry.settings import PROMOTIONS_EXPERIMENT

# -- planning ----------------------------------------------------------------------------------


def resolve(ctx: FleetContext) -> StageReport:
    """The plan, built from under the locks of every model whose config it may write (a plan that
    needs one more model takes its lock and is made again); the no-op decided here, once."""
    plan = ctx.plan
    _refuse_open_control(ctx)  # before anything else: a replica anyone can drive
    if not ctx.options.dry_run and already_serving(ctx, plan.model, plan.version):
        ctx.noop = True  # the fast path: no lock; MLflow only read (the repair stage follows)
        return NoopReport(plan.model, plan.version, ctx.env.name)
    _preconditions(ctx)
    assert plan.workdir is not None
    held: set[str] = set()
    wanted = _lock_names(ctx, plan.model)
    fleet = ctx.fleet
    fleet.refresh()  # the view (what each server holds) taken once, under the locks taken next

    def serves(model: str, version: str) -> bool:
        return fleet.serve_exactly({model: version})

    while wanted:
        for name in sorted(wanted):
            if not ctx.options.dry_run:  # a plan only reads: it never waits for, nor blocks, others
                ctx.locks.enter_context(locking.held(ctx.store.session, name, ctx.settings))
            held.add(name)
        if not ctx.options.dry_run:  # what a promotion that lost these locks uploaded and left
            ctx.result.notes.extend(remove_fenced_uploads(ctx.store, wanted, fleet.states()))
        plan = build_plan(
            ctx.registry.models,
            ctx.store,
            ctx.env,
            plan.targets,
            plan.model,
            plan.version,
            plan.workdir,
            serves,
        )
        wanted = {s.model for s in plan.steps} - held
    _repair_ensembles(ctx, plan)
    plan.skipped = ctx.plan.skipped
    ctx.set_plan(plan)
    if plan.noop:
        ctx.noop = True
        return NoopReport(plan.model, plan.version, ctx.env.name)
    check_serves_from_store(ctx)  # before any live stage (the canary gate loads too)
    refuse_pending_loads(ctx.fleet, [s.model for s in plan.steps], clear=not ctx.options.dry_run)
    ctx.result.notes.extend(swap_notes(ctx.env, plan))
    return ResolveReport([f"{s.model} v{s.version} ({s.role.value})" for s in plan.steps], sorted(held))


def _refuse_open_control(ctx: FleetContext) -> None:
    """A replica whose control API takes anyone's calls refuses the promotion (dry run included),
    unless the environment allows it: then it is noted (``replicas.open_control_notes``)."""
    allowed = ctx.env.open_control == "allow"
    timeout = min(5.0, ctx.settings.triton_timeout)
    ctx.result.notes.extend(
        open_control_notes(ctx.env.name, allowed, ctx.plan.targets, ctx.fleet.target, timeout)
    )


def repair(ctx: FleetContext) -> RepairReport:
    """The no-op's one write: each model that serves has the environment's alias on it, and no
    failed attempt's tag is newer than its own (``record.repair_record``).  Written only under the
    locks of the models that serve and of the ensembles over them, once what serves is asked
    again there (the no-op itself took no lock): a lock held by another writer, or a promotion
    that ended meanwhile, skips the repair and says so (issue 45 review, F1)."""
    plan = ctx.plan
    serving = serving_pins(ctx, plan.model, plan.version)
    with contextlib.ExitStack() as locks:  # under the locks of what serves and the ensembles over it
        names = repair_lock_names(ctx.store, serving)
        skipped = hold_repair_locks(locks, ctx.store.session, names, ctx.settings)
        if not skipped:  # what serves, asked again under the locks: a promotion may have ended since
            ctx.fleet.refresh()
            if (
                not already_serving(ctx, plan.model, plan.version)
                or serving_pins(ctx, plan.model, plan.version) != serving
            ):
                skipped = (
                    f"registry repair skipped (nothing changed): {plan.model} v{plan.version} no longer"
                    " serves as the no-op saw it (a promotion ended meanwhile)"
                )
        if skipped:
            ctx.result.notes.append(skipped)
            return RepairReport([])
        repaired = repair_record(ctx.registry.models, ctx.env, serving)
        with tempfile.TemporaryDirectory(prefix="mlreg-stamps-") as work:  # the ensembles over them too
            repaired += repair_ensemble_stamps(
                ctx.registry.models, ctx.store, ctx.env.name, serving, Path(work)
            )
    ctx.result.notes.extend(repaired)
    return RepairReport(repaired)


def already_serving(ctx: FleetContext, model: str, version: str) -> bool:
    """The store wants exactly this version, it is complete, every ensemble pins it, and every
    target serves exactly it (and, for an ensemble, every member at the version it pins).  A
    re-pointed ensemble is a registered version served from its old Triton folder: ``version``
    serves from the store's one folder when it is what that folder's config serves."""
    config = ctx.store.read_config(model)
    folder = _sole_folder(ctx, model, version, config)
    if folder is None or config is None:
        return False
    wanted = _stored_pins(model, folder, config)
    if wanted is None:
        return False
    if config_facts(config).is_ensemble and not _registered_as_stored(ctx, model, version, config, folder):
        return False
    for text in ensembles_pinning(ctx.store, [model]).values():
        if ensemble_pins(text)[model] not in (folder, "-1"):
            return False
    if not ctx.fleet.serve_exactly(wanted):
        return False
    return not any(_pins_astray(ctx, name, text) for name, text in ensembles_using(ctx, {model}).items())


def _sole_folder(ctx: FleetContext, model: str, version: str, config: str | None) -> str | None:
    """The one folder the store's ``config`` serves, when it is complete and is ``version`` (an
    ensemble too: one served from a folder numbered otherwise is migrated by promoting it)."""
    folders = config_facts(config).versions if config is not None else ()
    if config is None or len(folders) != 1:
        return None
    [folder] = folders
    if folder != version:  # an ensemble served from another folder moves to its own (one number)
        return None
    return folder if ctx.store.versions.read_manifest(model, folder) is not None else None


def _stored_pins(model: str, folder: str, config: str) -> dict[str, str] | None:
    """``model: folder`` and each member at the version ``config`` pins (None: one follows the
    latest version, which only the registry knows)."""
    wanted = {model: folder}
    for member, pinned in ensemble_pins(config).items():
        if int(pinned) <= 0:
            return None
        wanted[member] = pinned
    return wanted


def serving_pins(ctx: FleetContext, model: str, version: str) -> dict[str, str]:
    """``model: version`` and, for an ensemble, each member at the version its store config pins."""
    wanted = {model: version}
    config = ctx.store.read_config(model) or ""
    wanted.update({m: p for m, p in ensemble_pins(config).items() if int(p) > 0})
    return wanted


def _registered_as_stored(ctx: FleetContext, model: str, version: str, config: str, folder: str) -> bool:
    """The store's ensemble (served from Triton ``folder``) is registered ``version``: in its own
    folder, its pins are that version's (re-pointed ensembles keep their Triton folder, so the
    folder alone cannot tell version 1 from its re-pointed version 2); in another folder (a
    re-pointed version), its whole config is that version's, the version policy aside.  (The
    embedded registry answers from its files, without importing MLflow.)"""
    assert ctx.plan.workdir is not None
    fetched = ctx.plan.workdir / f"registered-{model}-{version}"
    shutil.rmtree(fetched, ignore_errors=True)  # asked again by the repair, under its locks
    fetched.mkdir(parents=True)
    ctx.registry.models.fetch_version(model, version, fetched)
    registered = (fetched / CONFIG_NAME).read_text()
    if folder == version:
        return ensemble_pins(registered) == ensemble_pins(config)
    gpu = ctx.env.gpu
    return desired_config(registered, [folder], gpu) == desired_config(config, [folder], gpu)


def ensembles_using(ctx: FleetContext, models: set[str]) -> dict[str, str]:
    """The store's ensembles that are one of ``models`` or pin one of them: name -> config."""
    return {
        name: text
        for name, text in ensembles_pinning(ctx.store).items()
        if name in models or models & set(ensemble_pins(text))
    }


def _pins_astray(ctx: FleetContext, name: str, text: str) -> list[str]:
    """Each target where ensemble ``name`` is not READY, or pins other member versions than the
    store's config (e.g. still -1 after an interrupted roll-out)."""
    stored = ensemble_pins(text)
    found = []
    for url in ctx.fleet.urls:
        live = ctx.fleet.live_pins(url, name)
        if live is None:
            found.append(f"{url}: ensemble {name} is not READY")
        elif live != stored:
            found.append(
                f"{url}: ensemble {name} pins {_pins(live)}, the store's config pins {_pins(stored)}"
            )
    return found


def _pins(pins: dict[str, str]) -> str:
    return ", ".join(f"{member} v{version}" for member, version in sorted(pins.items()))


def _repair_ensembles(ctx: FleetContext, plan: Plan) -> None:
    """An ensemble over the plan's models that a target does not serve as the store says (not
    loaded, or pinned elsewhere) is loaded again from the store's config by this promotion."""
    present = {s.model for s in plan.steps}
    for name, text in ensembles_using(ctx, present).items():
        if name in present or not _pins_astray(ctx, name, text):
            continue
        serving = serving_versions(text)
        version = serving[-1] if serving else "1"
        plan.steps.append(
            Step(name, version, Role.ENSEMBLE, None, text, text, serving, upload=False, reload=True)
        )


def _preconditions(ctx: FleetContext) -> None:
    """Triton, store and the registry reachable before anything starts."""
    ctx.registry.models.warm_up()  # MLflow's import overlaps with the work below
    if not ctx.options.skip_quality:
        quality.warm_up()  # great_expectations (seconds) imports while the promotion plans
    if ctx.env.policy is None:  # a staged policy checked every replica's liveness already
        ctx.fleet.check_live()
    ctx.store.list_models()
    ctx.registry.models.ping()


def _lock_names(ctx: FleetContext, model: str) -> set[str]:
    """The model, the members its stored config pins, and every ensemble of the store using it."""
    ensembles = ensembles_pinning(ctx.store)
    names = {model} | {name for name, text in ensembles.items() if model in ensemble_pins(text)}
    return names | set(ensemble_pins(ensembles.get(model, "")))


def wants_onnx(ctx: FleetContext) -> bool:
    """--serve-as onnx, or auto and a target whose Triton has no TensorFlow backend."""
    step = ctx.plan.step(ctx.plan.model)
    if step.folder is None or step.platform != "tensorflow_savedmodel":
        return False
    if ctx.options.serve_as != "auto":
        return ctx.options.serve_as == "onnx"
    return any(
        needs_onnx(str(ctx.fleet.target(url).server_metadata().get("version", "")))
        for url in ctx.plan.targets
    )


def convert(ctx: FleetContext) -> ConvertReport:
    """The SavedModel converted to ONNX in the work folder and numbered; ``assemble`` registers it."""
    plan = ctx.plan
    step = plan.step(plan.model)
    golden = quality.golden_inputs(ctx.settings, step.model, step.config_text)
    ctx.converted = converted = convert_step(step, golden, ctx.env.gpu, ctx.registry.models)
    _renumber(ctx, step, converted.step)
    worst = max(converted.parity.values(), default=0.0)
    return ConvertReport(step.model, step.version, converted.step.version, worst, converted.registered)


def _renumber(ctx: FleetContext, old: Step, new: Step) -> None:
    """``new`` replaces ``old`` in the plan; ensembles re-pointed to ``old`` point at ``new``."""
    plan = ctx.plan
    plan.steps[plan.steps.index(old)] = new
    plan.version = new.version
    for other in plan.steps:
        if other.role is Role.ENSEMBLE:
            other.config_text = desired_config(
                other.config_text, [other.version], ctx.env.gpu, {new.model: new.version}
            )


def validate(ctx: FleetContext) -> ValidateReport:
    plan = ctx.plan
    errors = offline.contract_errors(plan, ctx.store) + _repointed_errors(ctx)
    if errors:
        raise PromotionError(
            "contract check failed:\n  " + "\n  ".join(errors),
            fix="fix the model or its config and register a new version",
        )
    breaking = offline.breaking_changes(plan)
    if breaking and not ctx.options.allow_breaking:
        raise PromotionError(
            f"{plan.model} version {plan.version} breaks the contract of the serving version:\n  "
            + "\n  ".join(breaking),
            fix="promote with --allow-breaking once every ensemble using it is updated in "
            "the same promotion, or keep the contract",
        )
    verified = [name for step in plan.steps if not step.is_ensemble for name in _check_bytes(ctx, step)]
    verified += check_signatures(
        ctx.store, ctx.registry, plan.steps, ctx.env.signatures, plan.workdir, ctx.options.no_way_back
    )
    return ValidateReport(len(plan.steps), breaking, verified)


def _check_bytes(ctx: FleetContext, step: Step) -> list[str]:
    """Every stored version this promotion may load -- the new one, and those an abort would load
    again -- against its registered digest; a corrupt one restored from the registry by
    ``assemble`` when the registry's copy verifies (never loaded unverified)."""
    assert ctx.plan.workdir is not None
    wanted = [] if step.upload else [(step.version, step.digest)]
    wanted += [(v, step.previous_digests.get(v, "")) for v in step.previous_versions if v != step.version]
    checked = []
    for version, digest in wanted:
        try:
            repair = check_stored(ctx.store, ctx.registry.models, step, version, digest, ctx.plan.workdir)
        except PromotionError as exc:
            if version == step.version:
                raise  # what this promotion loads: refused
            if not ctx.options.no_way_back:  # an abort could not load it: no way back, no change
                raise no_way_back_error(
                    step.model,
                    version,
                    f"cannot be verified nor restored from the registry ({exc.message})",
                    f"restore {step.model} v{version} (register its bytes again, or promote a version "
                    "that verifies first)",
                ) from exc
            # the user said so: the undo log checks it again and leaves the model as it serves
            checked.append(f"{step.model}/{version} (unverified: an abort would leave it as it serves)")
            continue
        if repair is not None:
            ctx.repairs.append(repair)
        checked.append(f"{step.model}/{version}" + (" (corrupt: restored by assemble)" if repair else ""))
    return checked


def _repointed_errors(ctx: FleetContext) -> list[str]:
    """A re-pointed ensemble is registered as a new version: it must validate before any change."""
    from registry.register import Candidate, validate_candidate  # lazy: reads signatures: onnx, protobuf

    errors: list[str] = []
    for step in ctx.plan.steps:
        if step.role is Role.ENSEMBLE:
            folder = repointed_folder(ctx, step)
            found, _ = validate_candidate(Candidate(step.model, folder / "1", folder / "config.pbtxt"))
            errors.extend(f"re-pointed {step.model}: {line}" for line in found)
    return errors


def repointed_folder(ctx: FleetContext, step: Step) -> Path:
    """The re-pointed config as a registrable version: ``config.pbtxt`` + ``1/``, its version_policy
    naming folder 1 like every registered version's; the environment may serve it from another
    folder (``step.version``, e.g. "2" once a registered v2 was promoted), which the registry's
    fetch_version and the plan map back to."""
    assert ctx.plan.workdir is not None
    folder = ctx.plan.workdir / f"repointed-{step.model}"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(desired_config(step.config_text, ["1"], gpu=True))
    return folder


def _verify_bytes(ctx: FleetContext, step: Step) -> str:
    """The version's files in the store against its manifest and the digest registered in MLflow:
    the store's ``verify_version`` raises StorageError naming the file.  An upload whose manifest
    (written from the bytes sent) misses the registered digest names the files that differ from the
    registry's own manifest (nothing hashed again: both manifests list every file's sha256)."""
    try:
        ctx.store.versions.verify_version(step.model, step.version, step.digest or None)
    except StorageError as exc:
        changed = registered_differences(ctx.store.versions, ctx.registry, step)
        if changed:
            exc.message += "\n  " + "\n  ".join(changed)
        raise
    return f"{step.model}/{step.version}"


# -- changes -----------------------------------------------------------------------------------


def assemble(ctx: FleetContext) -> UploadReport:
    """A converted version registered (the registry's number may differ from the planned one),
    then every new version folder uploaded and verified (a re-pointed ensemble's: by ``deploy``,
    once it has its number)."""
    if ctx.converted is not None and not ctx.converted.registered:
        _register_converted(ctx, ctx.converted)
    repaired = [apply_repair(ctx.store.versions, repair) for repair in ctx.repairs]  # registered bytes back
    sent, uploaded = 0, repaired
    for step in ctx.plan.steps:
        if step.upload and step.folder is not None:
            count, name = _put(ctx, step)
            sent += count
            uploaded.append(name)
    for step in ctx.plan.steps:  # what the loads read next, verified (validate, above): no cache in it
        if not step.is_ensemble:
            for version in sorted({step.version, *serving_versions(step.config_text)}, key=int):
                ctx.store.versions.drop_bytecode(step.model, version)
    checkpoint("uploaded")
    return UploadReport(sent, ctx.store.uri, uploaded)


def _put(ctx: FleetContext, step: Step, stage: str = "assemble") -> tuple[int, str]:
    """``step``'s version folder uploaded (noted in the undo log first) by ``stage``, verified and
    its signature published: the bytes sent and what was verified."""
    assert step.folder is not None
    sent = 0
    ctx.undo.uploaded(step, step.version)
    note_upload(ctx.store, step.model, step.version)  # whose upload, if it is never finished
    if not retention.restored(ctx.store, step):  # archived: a server-side copy, verified
        folder = step.folder / step.version
        sent = ctx.store.versions.put_version(
            step.model, step.version, folder, _uploading(ctx, step, stage)
        ).bytes_sent
    verified = _verify_bytes(ctx, step)
    publish_signature(ctx.store.objects, step, ctx.plan.workdir)  # beside the manifest, when checked
    return sent, verified


def _uploading(ctx: FleetContext, step: Step, stage: str) -> Callable[[int], None] | None:
    """The upload's progress for the CLI's line (``Options.on_start``, on a terminal only): the
    stage, the model, its version and the bytes sent so far; None without a listener."""
    told = ctx.options.on_start
    if told is None:
        return None
    sent = [0]
    told(f"{stage}: uploading {step.model} v{step.version}")

    def progress(count: int) -> None:
        sent[0] += count
        told(f"{stage}: uploading {step.model} v{step.version} ({sent[0] / 1e6:.1f} MB sent)")

    return progress


Report = TypeVar("Report")


def numbered(deploy: Callable[[FleetContext], Report]) -> Callable[[FleetContext], Report]:
    """The ``deploy`` stage: each re-pointed ensemble registered and in its own folder first
    (``number_repointed``), then the deployer's roll-out."""

    def run(ctx: FleetContext) -> Report:
        number_repointed(ctx)
        return deploy(ctx)

    return run


def number_repointed(ctx: FleetContext) -> None:
    """Each re-pointed ensemble of the plan registered (an identical config reuses its version) and
    renumbered: from here on its step is that registered version, fetched from the registry as
    any version is, uploaded to its own folder and verified when the store lacks it.  After every
    gate (a refusal never writes MLflow), before the ensemble's first load (module docstring).
    Each registration is noted in the undo log before the call, with the id its version carries
    (``OWNER_TAG``): an exit from here on deletes what this promotion made, and only that."""
    plan = ctx.plan
    assert plan.workdir is not None
    promotion_id = ""
    for index, step in enumerate(plan.steps):
        if step.role is not Role.ENSEMBLE or _registered_as_folder(ctx, step):
            continue
        promotion_id = promotion_id or uuid.uuid4().hex
        folder = repointed_folder(ctx, step)
        new_model, pins = _new_to_registry(ctx, step.model), ensemble_pins(step.config_text)
        # noted first: an exit during the call (a signal) still finds what it made
        ctx.undo.registering(step.model, promotion_id, ctx.registry, new_model, pins)
        version = ctx.registry.register_version(
            step.model, folder / "1", folder / "config.pbtxt", members=pins, tags={OWNER_TAG: promotion_id}
        )
        fetched, tags = fetch_version(
            ctx.registry.models, step.model, version, plan.workdir / f"registered-{step.model}"
        )
        numbered_step = plan.steps[index] = replace(
            step,
            version=version,
            folder=fetched,
            config_text=desired_config(step.config_text, [version], ctx.env.gpu),
            upload=ctx.store.versions.read_manifest(step.model, version) is None,
            digest=tags.get("artifact_digest", ""),
        )
        ctx.undo.plan(plan.steps)
        if numbered_step.upload:
            _put(ctx, numbered_step, "deploy")
        made = "registered as" if tags.get(OWNER_TAG) == promotion_id else "the same config as registered"
        if version not in step.previous_versions:
            was = ", ".join(step.previous_versions) or "none"
            ctx.result.notes.append(
                f"{step.model} re-pointed: {made} v{version}, served from Triton folder {version} "
                f"(folder {was} before)"
            )
    checkpoint("numbered")


def _new_to_registry(ctx: FleetContext, model: str) -> bool:
    """Whether ``model`` is no registered model yet (an ensemble only the store knows): its
    registration creates it.  MLflow unreachable raises (nothing registered then)."""
    if ctx.registry.models.versions(model):
        return False
    try:
        ctx.registry.models.require_model(model)
    except RegistryError:  # MLflow just answered: the model is not registered
        return True
    return False


def _registered_as_folder(ctx: FleetContext, step: Step) -> bool:
    """The ensemble's config is already the registered version its folder is numbered as (a
    repair re-loading the store's config where a target lost it): nothing to register or move."""
    assert ctx.plan.workdir is not None
    try:
        fetched, _ = fetch_version(
            ctx.registry.models, step.model, step.version, ctx.plan.workdir / "as-folder"
        )
    except (MlregError, LookupError, OSError):  # no such registered version: register it
        return False
    return ensemble_pins((fetched / CONFIG_NAME).read_text()) == ensemble_pins(step.config_text)


def _register_converted(ctx: FleetContext, converted: Converted) -> None:
    step = converted.step
    version = register_converted(ctx.registry, ctx.registry.models, converted)
    if version != step.version:  # someone registered meanwhile: the registry's number wins
        assert step.folder is not None
        (step.folder / step.version).rename(step.folder / version)
        renumbered = replace(  # the previous versions' digests kept: the way back stays verifiable
            step, version=version, config_text=desired_config(step.config_text, [version], ctx.env.gpu)
        )
        _renumber(ctx, step, renumbered)
        converted.step = renumbered
    converted.registered = True


def verify(ctx: FleetContext) -> VerifyReport:
    """Every step READY and answering on every target, and every ensemble over them loaded with
    the store's pins there (the servers asked again: the view is not proof)."""
    ctx.fleet.refresh()
    for url in ctx.plan.targets:
        triton = ctx.fleet.target(url)
        for step in ctx.plan.steps:
            try:
                ready = triton.is_ready(step.model, step.version)
            except MlregError as exc:  # dropped after the roll-out (a restart?): named as such
                raise not_ready_after_rollout(triton, step.model, step.version, exc) from exc
            if not ready:  # a restart after the roll-out's last check is named here
                raise not_ready_after_rollout(triton, step.model, step.version)
            _smoke(ctx, triton, step)
    ensembles = ensembles_using(ctx, {s.model for s in ctx.plan.steps})
    astray = [line for name, text in ensembles.items() for line in _pins_astray(ctx, name, text)]
    if astray:
        raise PromotionError("; ".join(astray), fix="read the stage report; 'mlreg status' shows each target")
    return VerifyReport(list(ctx.plan.targets), [s.model for s in ctx.plan.steps])


def _peak(ctx: FleetContext, triton: ServingTarget, step: Step, inputs: dict[str, np.ndarray]) -> None:
    """The candidate at its peak batch, asked by version before any traffic meets it: the golden
    row repeated ``max_batch_size`` times (where its config carries no warmup that did so at the
    load, and the batch stays under WARMUP_BYTES).  A failure is the batch-dependent one a batch-1
    smoke never sees: the promotion stops and goes back."""
    config = parse_config(step.config_text)
    peak = config.max_batch_size
    if not ctx.env.warmup or step.is_ensemble or peak <= 1 or len(config.model_warmup):
        return
    if any(a.ndim == 0 or a.shape[0] != 1 for a in inputs.values()):
        return  # not one golden row per input: no peak batch to build from it
    if peak_bytes(config) > WARMUP_BYTES:
        return  # the plan's note says so (warmups.peak_sample)
    batch = {name: np.repeat(array, peak, axis=0) for name, array in inputs.items()}
    if sum(a.nbytes for a in batch.values()) > WARMUP_BYTES:
        return
    try:
        triton.infer(step.model, batch, quality.output_names(step.config_text), version=step.version)
    except MlregError as exc:
        peak_verdict(ctx.result, triton.url, step.model, step.version, peak, exc.message)
        raise PromotionError(
            f"{triton.url}: {step.model} v{step.version} fails at its peak batch of {peak}: {exc.message}",
            fix=f"fix the model for batches up to max_batch_size {peak} (or lower max_batch_size in its "
            "config.pbtxt), register it again and promote; the serving version is back",
        ) from exc
    peak_verdict(ctx.result, triton.url, step.model, step.version, peak, "")


def _smoke(ctx: FleetContext, triton: ServingTarget, step: Step) -> None:
    inputs = quality.golden_inputs(ctx.settings, step.model, step.config_text)
    _peak(ctx, triton, step, inputs)
    names = quality.output_names(step.config_text)
    version = "" if step.is_ensemble else step.version
    outputs = triton.infer(step.model, inputs, names, version=version)
    expected = (ctx.checked.outputs.get(step.model) if ctx.checked else None) or {}
    for name, array in outputs.items():
        if not np.isfinite(array).all():
            raise PromotionError(f"{triton.url}: {step.model}/{name} answered non-finite values")
        if name in expected and not np.allclose(array, expected[name], rtol=1e-4, atol=1e-4):
            raise PromotionError(
                f"{triton.url}: {step.model}/{name} differs from the pre-flight "
                "answer on the same golden inputs"
            )


def record(ctx: FleetContext) -> RecordReport:
    """Every other MLflow write (the tags; a re-pointed ensemble's version was registered by
    ``deploy``), then the aliases, all of them last;
    on a failure the aliases already moved and the tags go back (``record.RecordWrites``) and the
    error says exactly what moved; then the promotion's run."""
    plan = ctx.plan
    stamp = deployment_stamp()
    writes = RecordWrites(ctx.registry.models, ctx.env.alias, f"promoted_{ctx.env.name}")
    ctx.undo.wrote_registry(writes)  # any exit from here on puts these writes back
    try:
        versions: list[tuple[str, str]] = []
        for step in plan.steps:
            version = step.version  # a re-pointed ensemble's: registered by deploy (one number)
            writes.tag_version(step.model, version, stamp)
            versions.append((step.model, version))
        checkpoint("record:aliases")
        members = _pinned_members(plan, {model for model, _ in versions})
        for model, version in versions + members:  # the aliases move last
            writes.move_alias(model, version)
    except MlregError as exc:
        raise failed_record(writes, exc) from exc
    ctx.result.notes.extend(
        f"alias '{ctx.env.alias}' of {model} moved to v{version} (was {writes.aliases[model] or 'none'}): "
        f"the version {plan.model} v{plan.version} pins"
        for model, version in members
        if model in writes.aliases
    )
    record_promotion(ctx.registry, ctx.result, ctx.env, PROMOTIONS_EXPERIMENT, writes)
    ctx.result.notes.extend(mirror(ctx.registry.runs, ctx.result.run_id, ctx.fleet.ledger))  # ledger.jsonl
    uploads = [(e.model, v) for e in ctx.undo.entries.values() for v in e.uploaded]
    ctx.result.notes.extend(forget_uploads(ctx.store, uploads))  # finished: no litter
    return RecordReport(ctx.env.alias, plan.model, plan.version, ctx.result.run_id)


def _pinned_members(plan: Plan, moved: set[str]) -> list[tuple[str, str]]:
    """The members a promoted ensemble pins that the plan did not bring along (they served
    already): their aliases name the versions it pins too, so a failed attempt's alias left on
    another version is put right by promoting the ensemble."""
    step = plan.step(plan.model)
    if not step.is_ensemble:
        return []
    pins = ensemble_pins(step.config_text)
    return [(m, v) for m, v in sorted(pins.items()) if int(v) > 0 and m not in moved]
