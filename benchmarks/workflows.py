"""The workflows under act vs the same mlreg commands typed in one shell, on one local stack.

For each scenario the same work runs twice, side by side in this run: once as the workflow
(``act`` in host mode, tests/act/harness.py; no install step, the project's .venv is reused) and
once as a bash script of the workflow's ``mlreg`` commands.  Each push gets its own template
change, so both runs export, register and promote one new version.  Target: the workflow's
overhead within 1.3x of the direct run.

    .venv/bin/python benchmarks/workflows.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.act.harness import ENSEMBLE, WorkflowStack, workflow_stack  # noqa: E402

MODEL = "table_data_preprocess"
PUSH = """
mlreg export --changed --against staging --json > exported.json
mlreg promote --from-file exported.json --env staging --json > staging.json
mlreg report staging.json --markdown > staging.md
mlreg promote --from-alias staging --env production --json > production.json
mlreg report production.json --markdown > production.md
"""
PLAN = """
mlreg validate model_repository_template
mlreg export --changed --against staging --json > exported.json
mlreg promote --from-file exported.json --env staging --dry-run --json > plan.json
mlreg report plan.json --markdown > plan.md
"""
DISPATCH = """
MODEL='x"; touch PWNED; echo "' VERSION=1 TARGET_ENV=staging
mlreg promote "$MODEL" --version "$VERSION" --env "$TARGET_ENV" --json > manual.json
mlreg report manual.json --markdown > manual.md
"""


def shell(stack: WorkflowStack, script: str) -> tuple[float, int]:
    began = time.perf_counter()
    done = subprocess.run(["bash", "-c", script], cwd=stack.repo, env=stack.env(), capture_output=True)
    return time.perf_counter() - began, done.returncode


def push_change(stack: WorkflowStack, n: int) -> None:
    stack.commit(f"change {n}", {f"model_repository_template/{MODEL}/1/model.py": f"\n# change {n}\n"})


def breaking_change(stack: WorkflowStack) -> None:
    config = f"model_repository_template/{ENSEMBLE}/config.pbtxt"
    stack.replace(config, 'name: "image_preprocess_input"', 'name: "image_bytes"')
    stack.replace(config, 'value: "image_preprocess_input" }', 'value: "image_bytes" }')


def stage_seconds(*reports: Path) -> str:
    """Where a push's time went: the promotions' own stage timings (quality, deploy, ...)."""
    total: dict[str, float] = {}
    for path in reports:
        if not path.is_file():
            continue
        for entry in json.loads(path.read_text()).get("promotions", []):
            for stage in (entry.get("report") or {}).get("stages", []):
                total[stage["stage"]] = total.get(stage["stage"], 0.0) + float(stage["seconds"])
    return ", ".join(f"{k} {v:.0f}" for k, v in total.items() if v >= 1.0)


def push_round(stack: WorkflowStack, n: int, via_act: bool) -> tuple[float, str]:
    push_change(stack, n)
    if via_act:
        run = stack.act("push", "promote.yml", {"ref": "refs/heads/main"})
        if run.returncode != 0:
            log = Path(tempfile.gettempdir()) / f"mlreg-bench-workflows-push-{n}.log"
            log.write_text(run.output)
            print(f"  push {n} failed: act's log in {log}", flush=True)
        folder = stack.artifacts
        reports = (
            folder / "promotion-reports-staging/staging.json",
            folder / "promotion-reports-production/production.json",
        )
        return run.seconds, f"act {run.returncode}; stages: {stage_seconds(*reports)}"
    seconds, rc = shell(stack, PUSH)
    return (
        seconds,
        f"shell {rc}; stages: {stage_seconds(stack.repo / 'staging.json', stack.repo / 'production.json')}",
    )


def scenarios(stack: WorkflowStack) -> list[tuple[str, float, float, str]]:
    rows = []
    timed = {True: [], False: []}  # type: dict[bool, list[float]]
    for n, via_act in enumerate((True, False, False, True), start=1):  # ABBA: load drifts cancel
        seconds, note = push_round(stack, n, via_act)
        timed[via_act].append(seconds)
        print(f"  push {n} ({'act' if via_act else 'shell'}): {seconds:.1f} s  {note}", flush=True)
    rows.append(("push: staging + production", sum(timed[True]), sum(timed[False]), "2 rounds each, ABBA"))
    breaking_change(stack)
    direct, rc = shell(stack, PLAN)
    act = stack.act("pull_request", "plan.yml", {"pull_request": {"number": 1}})
    rows.append(("pull_request: plan (fails)", act.seconds, direct, f"act {act.returncode}"))
    inputs = {
        "action": "promote",
        "model": 'x"; touch PWNED; echo "',
        "version": "1",
        "environment": "staging",
    }
    act = stack.act("workflow_dispatch", "promote.yml", {"inputs": inputs})
    direct, rc = shell(stack, DISPATCH)
    rows.append(("workflow_dispatch: refused", act.seconds, direct, f"act {act.returncode}"))
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="mlreg-bench-workflows-") as tmp:
        began = time.perf_counter()
        with workflow_stack(Path(tmp)) as stack:
            seeded = time.perf_counter() - began
            print(f"stack + seed (export, ensemble v1 in staging and production): {seeded:.1f} s", flush=True)
            rows = scenarios(stack)
    print(f"{'scenario':<30} {'act (s)':>8} {'shell (s)':>9} {'ratio':>6}  note")
    for name, act, direct, codes in rows:
        print(f"{name:<30} {act:8.1f} {direct:9.1f} {act / direct:6.2f}  {codes}")


if __name__ == "__main__":
    main()
