"""The promotion's story in the MLflow UI (issue 48, item 6): the run and the versions link to
each other, in markdown MLflow renders.

- The run's description (MLflow's ``mlflow.note.content`` tag) says what was promoted where and
  with what outcome, links every version it moved or tried (``#/models/<name>/versions/<v>``, the
  UI's own routes, so the links work on whatever host serves the UI) and its verdict
  (``verdict.json``) and report (``report.json``); ``mlreg_versions`` lists them as
  ``name/version`` for scripts.
- Each of those versions' descriptions ends with a **Promotions** section: one line per promotion
  run (newest last, at most ``KEPT`` lines), its environment, outcome, a link to the run and to
  its verdict.  What ``register`` wrote above the section is kept as it is.

Every text written is bounded: names and ids come from the registry, an outcome is one of
mlreg's, and the section keeps ``KEPT`` lines.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from registry.errors import MlregError
from registry.lineage import deployment_stamp
from registry.mlflow.connection import MlflowConnection
from registry.mlflow.versions import MlflowVersions

SECTION = "**Promotions**"
KEPT = 20  # promotion lines kept on a version's page (the runs themselves stay in MLflow)
NOTE_TAG = "mlflow.note.content"  # the run page's description
OUTCOMES = ("promoted", "refused", "rolled back", "rollback failed")


def run_link(experiment_id: str, run_id: str, artifact: str = "") -> str:
    """The UI's route to a run (or to one of its artifacts), relative to the UI's own address."""
    tail = f"/artifacts/{artifact}" if artifact else ""
    return f"#/experiments/{experiment_id}/runs/{run_id}{tail}"


def version_link(model: str, version: str) -> str:
    return f"#/models/{model}/versions/{version}"


def run_description(
    experiment_id: str, run_id: str, env: str, outcome: str, versions: list[tuple[str, str]], error: str = ""
) -> str:
    """The run page's markdown: the outcome, the versions (linked), the verdict and the report."""
    head = versions[0] if versions else ("?", "?")
    lines = [  # the outcome, the verdict and why first: the UI shows a description's first lines
        f"**{_outcome(outcome)}**: promotion of {head[0]} v{head[1]} to `{env}` — "
        f"[verdict.json]({run_link(experiment_id, run_id, 'verdict.json')}) "
        f"· [report.json]({run_link(experiment_id, run_id, 'report.json')})",
    ]
    if error:
        lines += ["", f"Why: {_one_line(error, 600)}"]
    lines += ["", "**Versions**", "", *[f"- [{m} v{v}]({version_link(m, v)})" for m, v in versions]]
    return "\n".join(lines)


def promotion_line(experiment_id: str, run_id: str, env: str, outcome: str, when: str) -> str:
    """One line of a version's **Promotions** section."""
    return (
        f"- {when[:19].replace('T', ' ')} UTC `{env}`: **{_outcome(outcome)}** — "
        f"[run {run_id[:8]}]({run_link(experiment_id, run_id)}) · "
        f"[verdict]({run_link(experiment_id, run_id, 'verdict.json')})"
    )


def with_promotion(description: str, line: str) -> str:
    """``description`` with ``line`` added to its **Promotions** section (made when missing; the
    oldest lines dropped past ``KEPT``); the text above the section is kept as it is."""
    body, _, section = (description or "").partition(f"\n\n{SECTION}\n")
    if not section and description.startswith(f"{SECTION}\n"):
        body, section = "", description[len(SECTION) + 1 :]
    kept = [x for x in section.splitlines() if x.startswith("- ")] + [line]
    return (body.rstrip() + "\n\n" if body.strip() else "") + SECTION + "\n" + "\n".join(kept[-KEPT:])


def _outcome(outcome: str) -> str:
    return outcome if outcome in OUTCOMES else "unknown"


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class MlflowStory:
    """Writes the links between a promotion run and the versions it moved or tried."""

    def __init__(self, connection: MlflowConnection, versions: MlflowVersions) -> None:
        self.connection = connection
        self.versions = versions

    @property
    def _client(self) -> Any:
        return self.connection.client

    def link_promotion(
        self,
        run_id: str,
        experiment_id: str,
        env: str,
        outcome: str,
        versions: list[tuple[str, str]],
        error: str = "",
    ) -> None:
        """The run's description and ``mlreg_versions`` tag; each existing version's **Promotions**
        line (a version the registry does not hold -- a re-pointed ensemble a refused promotion
        never registered -- is left out).  ``experiment_id``: the run's experiment (its links)."""
        held = {(m, v): found for m, v in versions if (found := self._version(m, v)) is not None}
        named = list(held) or versions
        text = run_description(experiment_id, run_id, env, outcome, named, error)
        self._run_tag(run_id, NOTE_TAG, text)
        self._run_tag(run_id, "mlreg_versions", ",".join(f"{m}/{v}" for m, v in held)[:5000])
        line = promotion_line(experiment_id, run_id, env, outcome, deployment_stamp())
        for (model, version), found in held.items():
            described = with_promotion(str(getattr(found, "description", "") or ""), line)
            self.connection.call(
                "version update",
                partial(self._client.update_model_version, model, version, description=described),
            )

    def _run_tag(self, run_id: str, key: str, value: str) -> None:
        self.connection.call("run tag", partial(self._client.set_tag, run_id, key, value))

    def _version(self, model: str, version: str) -> Any:
        """The registry's version, or None where it holds none."""
        try:
            return self.versions.version(model, version)
        except MlregError:
            return None
