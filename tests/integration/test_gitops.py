"""infra/gitops checked offline with the engines' own schemas, and its promotion Job run for real.

- Every environment's kustomization (and the RollingSync variant with components/health-gated)
  rendered by ``kubectl kustomize`` and validated by ``kubernetes-validate --strict``.
- The Argo CD Application and ApplicationSet, the Argo Rollouts and Kargo AnalysisTemplates, the
  Kargo Warehouse and Stages validated against the openAPIV3Schema of the engines' own CRDs
  (tests/fixtures/gitops-crds: source, commit and licence in its README), made strict as the API
  server's strict field validation is (an unknown field is an error); a broken manifest of each
  kind is rejected (negative controls).
- The hook Job's container command, taken from the rendered manifest, run against a local stack
  (a real tritonserver on a local-folder store, the embedded sqlite MLflow) with its environment
  and mounts mapped to local paths: what serves, the aliases, the exit code; a second run changes
  nothing; a pinned version MLflow does not hold exits 4 naming it, nothing changed.
- ``mlreg analysis serve`` answered over HTTP on that stack and judged by the Argo Rollouts
  template's own ``jsonPath``/``successCondition``.
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.conftest import ROOT
from tests.integration.fleetstack import ENSEMBLE_CONFIG, scorer
from tests.integration.infra import image_pinned, kubectl
from tests.integration.stacks import SCORER_CONFIG, LocalStack, local_stack, register_model

pytestmark = pytest.mark.integration

GITOPS = ROOT / "infra" / "gitops"
EXAMPLE = GITOPS / "example"
CRDS = ROOT / "tests" / "fixtures" / "gitops-crds"
ENVIRONMENTS = ("staging", "production")
GATED = "production+health-gated"  # the ApplicationSet's Applications: components/health-gated added
RENDERS = (*ENVIRONMENTS, GATED)
ENGINE_FILES = ("argocd/application.yaml", "argocd/applicationset.yaml", "rollouts/analysistemplate.yaml")
ENGINE_FILES += ("kargo/analysistemplate.yaml", "kargo/pipeline.yaml")


# --- rendering -----------------------------------------------------------------------------------


@cache
def rendered(variant: str) -> str:
    """``kubectl kustomize`` of example/<env>; ``<env>+<component>`` adds components/<component>
    the way Argo CD's ``source.kustomize.components`` does (a kustomization over the path)."""
    env, _, component = variant.partition("+")
    if not component:
        return _kustomize(EXAMPLE / env)
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.relpath(EXAMPLE / env, tmp)
        extra = os.path.relpath(EXAMPLE / "components" / component, tmp)
        (Path(tmp) / "kustomization.yaml").write_text(f"resources: [{base}]\ncomponents: [{extra}]\n")
        return _kustomize(Path(tmp))


def _kustomize(path: Path) -> str:
    out = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def documents(variant: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered(variant)) if d]


def find(variant: str, kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in documents(variant) if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def fleet_job(variant: str) -> dict[str, Any]:
    return find(variant, "Job", "mlreg-fleet-sync")


def engine_documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, doc) for name in ENGINE_FILES for doc in yaml.safe_load_all((GITOPS / name).read_text()) if doc
    ]


# --- the engines' CRD schemas, strict ------------------------------------------------------------


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the served version's openAPIV3Schema, made strict."""
    found = {}
    for path in sorted(CRDS.glob("*.yaml.gz")):
        crd = yaml.load(gzip.decompress(path.read_bytes()), Loader=yaml.CSafeLoader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served", True):
                schema = strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
                found[(f"{group}/{version['name']}", kind)] = schema
    return found


def strict(schema: Any) -> Any:
    """An object schema that lists its properties refuses any other (the API server's strict field
    validation: kubectl apply --validate=strict); preserve-unknown-fields and maps stay open."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("properties", "definitions", "patternProperties"):
                for sub in value.values():
                    strict(sub)
            elif isinstance(value, dict | list):
                strict(value)
        open_ = schema.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in schema
        if "properties" in schema and not open_:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        for item in schema:
            strict(item)
    return schema


def schema_errors(doc: dict[str, Any]) -> list[str]:
    schema = crd_schemas()[(doc["apiVersion"], doc["kind"])]
    # lazy: jsonschema's import builds its IRI parsers (~2 s of CPU), paid by every worker that
    # collects this module otherwise; only the worker that runs it needs it
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


# --- Kubernetes objects --------------------------------------------------------------------------


def gitops_documents(variant: str) -> list[dict[str, Any]]:
    """What infra/gitops adds to the environment's overlay (whose documents test_infra.py checks)."""
    overlay = [d for d in yaml.safe_load_all(_overlay(variant.partition("+")[0])) if d]
    return [d for d in documents(variant) if d not in overlay]


@cache
def _overlay(env: str) -> str:
    return _kustomize(ROOT / "infra" / "k8s" / "overlays" / env)


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])  # the oldest the clouds run, the newest
def test_what_gitops_adds_passes_strict_kubernetes_validation(version: str) -> None:
    """``kubernetes-validate --strict``'s own check (its API: one process for every document),
    and the same Job with a field misspelt is rejected."""
    import kubernetes_validate

    kinds = set()
    for variant in RENDERS:
        env = variant.partition("+")[0]
        assert {d["metadata"].get("namespace") for d in documents(variant)} == {None, f"mlreg-{env}"}
        for doc in gitops_documents(variant):
            kubernetes_validate.validate(doc, version, strict=True)
            kinds.add(doc["kind"])
    assert kinds == {"Job", "Deployment", "Service", "ConfigMap"}
    broken = copy.deepcopy(fleet_job("production"))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="'imagePullPolcy' was unexpected"):
        kubernetes_validate.validate(broken, version, strict=True)


def test_the_promotion_job_is_a_postsync_hook_and_an_ordinary_job_under_rollingsync() -> None:
    for env in ENVIRONMENTS:
        annotations = fleet_job(env)["metadata"]["annotations"]
        assert annotations["argocd.argoproj.io/hook"] == "PostSync"
        assert annotations["argocd.argoproj.io/hook-delete-policy"] == "BeforeHookCreation"
    gated = fleet_job(GATED)
    assert gated["metadata"]["annotations"] == {
        "argocd.argoproj.io/sync-wave": "1",
        "argocd.argoproj.io/sync-options": "Force=true,Replace=true",
    }
    assert "ttlSecondsAfterFinished" not in gated["spec"]  # a Job that vanished would be re-created
    hook = fleet_job("production")
    assert gated["spec"] == hook["spec"]  # the same promotion either way
    assert hook["spec"]["backoffLimit"] == 0


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_the_job_reads_its_environments_fleet_file_with_the_promotion_jobs_image_and_access(env: str) -> None:
    spec = fleet_job(env)["spec"]["template"]["spec"]
    [container] = spec["containers"]
    script = " ".join(container["args"])
    assert (
        'mlreg fleet sync "/fleet/${MLREG_NAMESPACE#mlreg-}.toml" --env "${MLREG_NAMESPACE#mlreg-}"' in script
    )
    # what infra/k8s/base/promote-job.yaml runs with: image, account, credentials, mlreg.toml
    cron = find(env, "CronJob", "mlreg-promote")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [promote] = cron["containers"]
    assert image_pinned(container["image"])
    assert container["image"] == promote["image"]
    assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == ("triton", False)
    assert container["envFrom"] == promote["envFrom"]
    promote_env = {e["name"]: e for e in promote["env"]}
    for variable in container["env"]:
        if variable["name"] != "MLREG_FROM_ALIAS":
            assert variable == promote_env[variable["name"]], variable["name"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    fleet_map = volumes[mounts["/fleet"]]["configMap"]["name"]
    assert volumes[mounts["/work/mlreg.toml"]]["configMap"]["name"] == "mlreg-config"
    [config] = [d for d in documents(env) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == fleet_map]
    assert re.fullmatch(r"mlreg-fleet-[a-z0-9]{10}", fleet_map)  # a content hash: a change re-syncs
    assert f"{env}.toml" in config["data"]
    pinned = tomllib.loads(config["data"][f"{env}.toml"])
    assert pinned["environment"] == env
    assert pinned == tomllib.loads((EXAMPLE / "fleet" / f"{env}.toml").read_text())
    # the Kargo verification Job and the analysis server run the same image
    [kargo_template] = [d for n, d in engine_documents() if n == "kargo/analysistemplate.yaml"]
    job = kargo_template["spec"]["metrics"][0]["provider"]["job"]["spec"]["template"]["spec"]
    assert job["containers"][0]["image"] == container["image"]
    [server] = find(env, "Deployment", "mlreg-analysis")["spec"]["template"]["spec"]["containers"]
    assert server["image"] == container["image"]


# --- the engines' custom resources ---------------------------------------------------------------


def test_engine_manifests_pass_their_crd_schemas() -> None:
    kinds = set()
    for name, doc in engine_documents():
        assert (doc["apiVersion"], doc["kind"]) in crd_schemas(), (name, doc["kind"])
        assert schema_errors(doc) == [], name
        kinds.add(doc["kind"])
    assert kinds == {"Application", "ApplicationSet", "AnalysisTemplate", "Warehouse", "Stage"}


BROKEN = {  # (file, kind) -> what breaks it, and the error the schema gives
    ("rollouts/analysistemplate.yaml", "AnalysisTemplate"): (
        lambda d: d["spec"]["metrics"][0].update(
            sucessCondition=d["spec"]["metrics"][0].pop("successCondition")
        ),
        "'sucessCondition' was unexpected",
    ),
    ("argocd/applicationset.yaml", "ApplicationSet"): (
        lambda d: d["spec"]["strategy"].update(rolingSync=d["spec"]["strategy"].pop("rollingSync")),
        "'rolingSync' was unexpected",
    ),
    ("argocd/application.yaml", "Application"): (
        lambda d: d["spec"]["syncPolicy"]["automated"].update(prune="yes"),
        "'yes' is not of type 'boolean'",
    ),
    ("kargo/pipeline.yaml", "Stage"): (
        lambda d: d["spec"].pop("requestedFreight"),
        "'requestedFreight' is a required property",
    ),
}


@pytest.mark.parametrize("where", sorted(BROKEN), ids=lambda w: w[1])
def test_a_broken_engine_manifest_is_rejected(where: tuple[str, str]) -> None:
    """Negative controls: the same documents with one field misspelt, mistyped or missing fail."""
    name, kind = where
    doc = copy.deepcopy(next(d for n, d in engine_documents() if n == name and d["kind"] == kind))
    breaks, message = BROKEN[where]
    breaks(doc)
    assert any(message in error for error in schema_errors(doc)), schema_errors(doc)


def test_rollingsync_moves_staging_then_each_production_region_once() -> None:
    [appset] = [d for n, d in engine_documents() if d["kind"] == "ApplicationSet"]
    elements = appset["spec"]["generators"][0]["list"]["elements"]
    template = appset["spec"]["template"]
    steps = appset["spec"]["strategy"]["rollingSync"]["steps"]
    order = []
    for element in elements:
        labels = {
            k: v.replace("{{.environment}}", element["environment"]).replace("{{.region}}", element["region"])
            for k, v in template["metadata"]["labels"].items()
        }
        matching = [i for i, step in enumerate(steps) if _selects(step["matchExpressions"], labels)]
        assert len(matching) == 1, (element["cluster"], matching)  # each Application in one step
        order.append((matching[0], element["cluster"]))
        path = ROOT / template["spec"]["source"]["path"].replace("{{.environment}}", element["environment"])
        assert (path / "kustomization.yaml").is_file(), path
        for component in template["spec"]["source"]["kustomize"]["components"]:
            assert (path / component / "kustomization.yaml").is_file(), component
    assert [cluster for _, cluster in sorted(order)] == ["staging-eu", "production-eu", "production-us"]
    assert len({step for step, _ in order}) == len(steps)  # no empty step
    for app in (d for _, d in engine_documents() if d["kind"] == "Application"):
        env = app["metadata"]["name"].removeprefix("mlreg-")
        assert app["spec"]["source"]["path"] == f"infra/gitops/example/{env}"
        assert app["spec"]["destination"]["namespace"] == f"mlreg-{env}"


def _selects(expressions: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    return all((labels.get(e["key"]) in e["values"]) == (e["operator"] == "In") for e in expressions)


def test_the_web_metric_asks_the_analysis_service_on_the_route_mlreg_serves() -> None:
    from mlreg.ops.analysis import ROUTE

    [template] = [d for n, d in engine_documents() if n == "rollouts/analysistemplate.yaml"]
    [metric] = template["spec"]["metrics"]
    url = metric["provider"]["web"]["url"]
    host, _, path = url.removeprefix("http://").partition("/")
    service = find("production", "Service", "mlreg-analysis")
    port = service["spec"]["ports"][0]["port"]
    assert host == f"mlreg-analysis.mlreg-{{{{args.environment}}}}.svc.cluster.local:{port}"
    assert ROUTE.match(
        "/" + path.replace("{{args.environment}}", "production").replace("{{args.model}}", "m")
    )
    assert {a["name"] for a in template["spec"]["args"]} == {"environment", "model"}


def test_each_kargo_stage_syncs_an_application_that_authorises_it_and_verifies_with_mlreg() -> None:
    docs = [d for _, d in engine_documents()]
    [verify] = [
        d for d in docs if d["kind"] == "AnalysisTemplate" and d["metadata"]["name"] == "mlreg-verify"
    ]
    apps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Application"}
    stages = [d for d in docs if d["kind"] == "Stage"]
    assert [s["metadata"]["name"] for s in stages] == list(ENVIRONMENTS)
    for stage in stages:
        name, project = stage["metadata"]["name"], stage["metadata"]["namespace"]
        [step] = stage["spec"]["promotionTemplate"]["spec"]["steps"]
        [target] = step["config"]["apps"]
        annotations = apps[target["name"]]["metadata"]["annotations"]
        assert annotations["kargo.akuity.io/authorized-stage"] == f"{project}:{name}"
        verification = stage["spec"]["verification"]
        assert verification["analysisTemplates"] == [{"name": verify["metadata"]["name"]}]
        assert {a["name"] for a in verification["args"]} == {a["name"] for a in verify["spec"]["args"]}
        assert {"name": "environment", "value": name} in verification["args"]
    command = verify["spec"]["metrics"][0]["provider"]["job"]["spec"]["template"]["spec"]["containers"][0]
    assert command["command"][:3] == ["mlreg", "analysis", "check"]


# --- the hook's promotion, for real ----------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The local stack (a real tritonserver on a local-folder store, the embedded sqlite MLflow)
    at the path the Job's MLREG_HOME (/work/.mlreg) maps to, ``scorer`` v1 and the ensemble ``scoring``
    v1 (pinning it) registered."""
    root = tmp_path_factory.mktemp("gitops")
    (root / "work").mkdir()
    (root / "work" / "mlreg.toml").write_text("# ConfigMap mlreg-config: 'local' is built in\n")
    with local_stack(None, root / "work" / ".mlreg") as running:
        work = root / "registered"
        register = functools.partial(register_model, running.registry)
        assert register(work / "scorer-1", "scorer", SCORER_CONFIG, {"model.py": scorer("v1")}) == "1"
        assert register(work / "scoring-1", "scoring", ENSEMBLE_CONFIG, {}, members={"scorer": "1"}) == "1"
        yield running


@dataclass
class JobRun:
    code: int
    report: dict[str, Any]
    messages: str  # the termination message (mlreg's stderr)


def run_the_job(stack: LocalStack, pins: dict[str, int]) -> JobRun:
    """The rendered hook Job's container command run here: its mounts at ``<root>/<mountPath>``
    (the fleet ConfigMap's files, plus ``local.toml`` = ``pins``), its namespace ``mlreg-local``
    (environment ``local``: the local stack), its Secret the stack's control key, its ConfigMap
    references the rendered ConfigMaps' values, MLflow the stack's embedded registry."""
    [container] = fleet_job("production")["spec"]["template"]["spec"]["containers"]
    root = stack.settings.home.parent.parent
    paths = {m["mountPath"]: root / m["mountPath"].lstrip("/") for m in container["volumeMounts"]}
    paths["/dev/termination-log"] = root / "termination-log"
    fleet = paths["/fleet"]
    fleet.mkdir(exist_ok=True)
    [data] = [
        d["data"]
        for d in documents("production")
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("mlreg-fleet-")
    ]
    for name, text in {
        **data,
        "local.toml": "[models]\n" + "".join(f"{m} = {v}\n" for m, v in pins.items()),
    }.items():
        (fleet / name).write_text(text)
    pattern = re.compile(
        r"(?<![\w/.])(" + "|".join(map(re.escape, sorted(paths, key=len, reverse=True))) + r")(?![\w.-])"
    )

    def local(text: str) -> str:
        return pattern.sub(lambda m: str(paths[m.group(1)]), text)

    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin", "LANG": "C.UTF-8"}
    env.update(job_variables(container, local))
    env["MLFLOW_TRACKING_URI"] = stack.settings.tracking_uri  # http://mlflow:5000 there
    command = [*container["command"], *map(local, container["args"])]
    done = subprocess.run(
        command, cwd=local(container["workingDir"]), env=env, capture_output=True, text=True, timeout=300
    )
    messages = paths["/dev/termination-log"].read_text() if paths["/dev/termination-log"].exists() else ""
    assert done.stderr == "", done.stderr  # everything mlreg says goes to the termination message
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"exit {done.returncode}, stdout {done.stdout!r}\n{messages}") from None
    return JobRun(done.returncode, report, messages)


def job_variables(container: dict[str, Any], local: Any) -> dict[str, str]:
    """The container's environment as Kubernetes would set it, in namespace mlreg-local."""
    config_maps = {
        d["metadata"]["name"]: d.get("data", {}) for d in documents("production") if d["kind"] == "ConfigMap"
    }
    found: dict[str, str] = {}
    for variable in container["env"]:
        source = variable.get("valueFrom", {})
        if "value" in variable:
            found[variable["name"]] = local(variable["value"])
        elif "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.namespace"
            found[variable["name"]] = "mlreg-local"
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            found[variable["name"]] = config_maps[ref["name"]][ref["key"]]
        elif source["secretKeyRef"]["name"] == "mlreg-control":
            found[variable["name"]] = os.environ["MLREG_CONTROL_KEY"]  # the stack's key
        else:
            assert source["secretKeyRef"].get("optional") is True, variable  # absent here
    for ref in container.get("envFrom", []):
        assert ref["secretRef"].get("optional") is True  # S3 keys: none for a local-folder store
    return found


def test_the_hook_job_promotes_what_the_fleet_file_pins_ensembles_first(stack: LocalStack) -> None:
    run = run_the_job(stack, {"scoring": 1, "scorer": 1})
    assert run.code == 0, run.messages
    assert run.report["ok"] is True
    assert (run.report["environment"], run.report["pins"]) == ("local", {"scorer": "1", "scoring": "1"})
    outcome = [(p["model"], p["ok"], p.get("held", False)) for p in run.report["promotions"]]
    assert outcome == [("scoring", True, False), ("scorer", True, True)]  # the ensemble brought scorer v1
    assert (stack.serving("scorer"), stack.serving("scoring")) == (["1"], ["1"])
    assert (stack.desired("scorer"), stack.desired("scoring")) == (["1"], ["1"])  # the store's configs
    assert {m: stack.registry.models.aliases(m).get("local") for m in ("scorer", "scoring")} == {
        "scorer": "1",
        "scoring": "1",
    }
    assert [row["ok"] for row in run.report["health"]] == [True, True]
    assert "resolve" in run.messages  # the stage lines went to the termination message


def test_a_second_run_of_the_job_changes_nothing(stack: LocalStack) -> None:
    before = stack.refused()
    run = run_the_job(stack, {"scoring": 1, "scorer": 1})
    assert (run.code, run.report["moved"], run.report["promotions"]) == (0, [], [])
    assert stack.refused() == before


def test_a_pinned_version_mlflow_does_not_hold_exits_4_naming_it_and_changes_nothing(
    stack: LocalStack,
) -> None:
    before = stack.refused()
    run = run_the_job(stack, {"scoring": 1, "scorer": 9})
    assert run.code == 4, run.messages
    assert "scorer v9" in run.messages
    assert "scorer v9" in run.report["error"]
    assert stack.refused() == before


def test_a_file_whose_ensemble_pins_other_member_versions_is_refused_before_any_change(
    stack: LocalStack,
) -> None:
    from mlreg.ops.fleet_pins import sync
    from registry.errors import UsageError

    second = {"model.py": scorer("v2")}
    folder = stack.settings.home.parent.parent / "registered" / "scorer-2"
    assert register_model(stack.registry, folder, "scorer", SCORER_CONFIG, second) == "2"
    (stack.settings.home.parent / "local.toml").write_text("[models]\nscoring = 1\nscorer = 2\n")
    before = stack.refused()
    with pytest.raises(UsageError, match="scoring v1 pins scorer v1, the file pins scorer = 2"):
        sync(stack.settings, stack.settings.home.parent / "local.toml", "local")
    assert stack.refused() == before


# --- the bake's verdict over HTTP ----------------------------------------------------------------


def condition_holds(condition: str, result: dict[str, Any]) -> bool:
    """An Argo Rollouts successCondition of ``result.<field> <op> <literal>`` terms and ``&&``."""
    literals = {"true": True, "false": False}
    ops = {"==": lambda a, b: a == b, "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b}
    holds = True
    for term in condition.split("&&"):
        match = re.fullmatch(r"\s*result\.(\w+)\s*(==|<=|>=)\s*(\S+)\s*", term)
        assert match, f"not understood: {term!r}"
        field, op, raw = match.groups()
        value = literals[raw] if raw in literals else float(raw)
        holds = holds and ops[op](result[field], value)
    return holds


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_the_analysis_server_answers_the_bake_checks_the_rollouts_metric_judges(stack: LocalStack) -> None:
    from mlreg.cli.main import app
    from mlreg.ops.analysis import start
    from pipelines.core.policy import Policy
    from pipelines.triton.control import TritonControl
    from tests.cli import CliRunner

    [template] = [d for n, d in engine_documents() if n == "rollouts/analysistemplate.yaml"]
    [metric] = template["spec"]["metrics"]
    assert metric["provider"]["web"]["jsonPath"] == "{$}"  # the whole document is ``result``
    with TritonControl(stack.url) as triton:
        for _ in range(12):
            triton.infer("scorer", {"X": np.ones(4, dtype=np.float32)}, ["Y"])
    server = start(stack.settings, ["local"], "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        base = f"{server.url}/v1/analysis"
        status, doc = get(f"{base}/local/scorer")
        assert status == 200, doc
        assert (doc["model"], doc["version"], doc["compared_with"]) == ("scorer", "1", [])
        assert doc["requests"] >= 12, doc
        assert doc["ok"] is True, doc
        assert [c["name"] for c in doc["checks"]] == [c.metric for c in Policy().checks]
        assert condition_holds(metric["successCondition"], doc)
        status, quiet = get(f"{base}/local/scorer?window=0.3")  # no request in the window: min requests
        assert (status, quiet["ok"], quiet["failed_check"], quiet["requests"]) == (200, False, "requests", 0)
        assert not condition_holds(metric["successCondition"], quiet)
        assert get(f"{base}/local/nosuch")[0] == 404
        assert get(f"{base}/production/scorer")[0] == 404  # not an environment this server answers for
        assert get(f"{base}/local/scorer?version=x")[0] == 400
        assert get(f"{base}/local/scorer?version=7")[0] == 404
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    once = CliRunner().invoke(
        app, ["analysis", "check", "scorer", "--env", "local", "--json"], env=stack.env_vars
    )
    assert once.exit_code == 0, once.output
    assert json.loads(once.stdout).keys() == doc.keys()
    failed = CliRunner().invoke(
        app, ["analysis", "check", "scorer", "--env", "local", "--window", "0.3"], env=stack.env_vars
    )
    assert failed.exit_code == 1, failed.output
    assert "FAILED (requests)" in failed.stdout
