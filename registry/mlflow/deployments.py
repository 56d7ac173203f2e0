"""Where a model serves, as the registered model's tags and description say (no MLflow import).

``MlflowDeployments.record_deployment`` keeps one ``deployed_<env>`` tag per environment (a JSON
entry: version, when, run, targets) and renders them as a table in the model's description.
"""

from __future__ import annotations

import json
from typing import Any

DEPLOYMENTS_HEADING = "**Environments**"


def deployments_of(tags: dict[str, str]) -> dict[str, dict[str, Any]]:
    found = {}
    for key, value in tags.items():
        if key.startswith("deployed_"):
            try:
                found[key.removeprefix("deployed_")] = dict(json.loads(value))
            except (ValueError, TypeError):
                continue
    return dict(sorted(found.items()))


def describe_deployments(description: str, deployments: dict[str, dict[str, Any]]) -> str:
    """The registered model's description with its environments table (replaced, never appended twice)."""
    head = description.split(DEPLOYMENTS_HEADING, 1)[0].rstrip()
    if not deployments:
        return head
    rows = [
        f"| {env} | {d.get('version', '?')} | {d.get('when', '')} | {', '.join(d.get('targets', [])) or '-'} "
        f"| `{d.get('run', '')}` |"
        for env, d in deployments.items()
    ]
    table = [
        "| environment | version | promoted | replicas | promotion run |",
        "|---|---|---|---|---|",
        *rows,
    ]
    return "\n".join([head, "", DEPLOYMENTS_HEADING, "", *table]).lstrip()
