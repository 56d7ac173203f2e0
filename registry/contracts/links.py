"""The one rule for symbolic links in a model folder: a link that leaves the model folder is refused.

Used everywhere bytes are read from a model folder: ``mlreg validate`` (a finding), ``register``
(through :func:`registry.manifest.folder_files`) and ``store push`` / ``put_version``.  A link whose
target stays inside the model folder is allowed (it is the same bytes, read twice); a version folder
that is itself a link to a folder outside is refused, and so is ``1/passwd.txt -> /etc/passwd``.

Pure: reads only link targets and folder listings; no network, no hashing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from registry.contracts.findings import Finding, error
from registry.errors import ContractError, MlregError

FIX = "copy the file or folder into the model folder instead of linking to it"


@dataclass(frozen=True)
class OutsideLink:
    link: Path  # the link itself, as found under the model folder
    target: Path  # where it leads (fully resolved)
    model_folder: Path

    def message(self) -> str:
        return f"{self.link} is a link to {self.target}, outside the model folder {self.model_folder}"


def _leaves(link: Path, root: Path) -> Path | None:
    """The resolved target of ``link`` when it is outside ``root``, else None."""
    target = Path(os.path.realpath(link))  # a loop resolves to itself: it leaves nothing
    return None if target == root or target.is_relative_to(root) else target


def outside_links(model_folder: Path, start: Path | None = None) -> list[OutsideLink]:
    """Every link under ``start`` (default: the model folder; ``start`` itself included) whose
    target is not inside ``model_folder``.  Links are not followed while walking."""
    root = model_folder.resolve()
    top = start if start is not None else model_folder
    found: list[OutsideLink] = []
    if top != model_folder and top.is_symlink():
        target = _leaves(top, root)
        if target is not None:
            return [OutsideLink(top, target, model_folder)]  # nothing under it is the model's
    for here, dirs, files in os.walk(top, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(here) / name
            if path.is_symlink():
                target = _leaves(path, root)
                if target is not None:
                    found.append(OutsideLink(path, target, model_folder))
    return found


def refuse_outside_links(
    model_folder: Path, start: Path | None = None, error: type[MlregError] = ContractError
) -> None:
    """Raise ``error`` naming the first link under ``start`` that leaves ``model_folder``."""
    links = outside_links(model_folder, start)
    if links:
        more = f" (and {len(links) - 1} more link(s) leaving it)" if len(links) > 1 else ""
        raise error(links[0].message() + more, fix=FIX, file=str(links[0].link))


def link_findings(model: str, model_folder: Path) -> list[Finding]:
    """One ``outside-link`` error finding per link leaving ``model_folder`` (for ``validate``)."""
    return [
        error("outside-link", model, link.message(), FIX, file=str(link.link))
        for link in outside_links(model_folder)
    ]
