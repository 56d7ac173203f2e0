"""``mlreg template build OUT``: the seed's multimodal ensemble as a working Triton repository."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from registry.settings import Settings


def build_template(
    settings: Settings,
    out_dir: Path,
    models: list[str] | None = None,
    *,
    seed: int = 0,
    device: str = "auto",
    force: bool = False,
    on_model: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write the complete, loadable repository into ``out_dir``; what was built, as the command's
    JSON document (``out``, ``models``, ``exported``, ``cpu_rewritten``)."""
    from registry import template  # lazy: the template builder loads only when this verb runs

    result = template.build(
        settings.template_dir,
        out_dir.resolve(),
        models=models or None,
        seed=seed,
        device=device,
        force=force,
        on_model=on_model,
    )
    return {
        "out": str(result.out),
        "models": result.models,
        "exported": result.exported,
        "cpu_rewritten": result.cpu_rewritten,
    }


__all__ = ["build_template"]
