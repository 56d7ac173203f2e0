"""The documentation site (docs/, issue 48 item 2) stays true to the code: the generated CLI
reference names every command and option, the tutorials' shell blocks are exactly the blocks
tests/integration/test_tutorial.py runs, and the reference tables (exit codes, mlreg.toml keys)
list what the code reads.  The strict mkdocs build itself runs in `make test` and `make lint`
(~3 s: the Makefile), not here."""

from __future__ import annotations

import html
import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from docs import cli_reference, tutorial_blocks
from tests.conftest import ROOT

DOCS = ROOT / "docs"
SITE = tutorial_blocks.SITE


def site_pages() -> list[Path]:
    return sorted(SITE.rglob("*.md"))


def nav_files(nav: Any) -> list[str]:
    """The page paths the nav names, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_files(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_files(value)]
    return []


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return yaml.safe_load((DOCS / "mkdocs.yml").read_text())


@pytest.fixture(scope="module")
def reference() -> str:
    return cli_reference.markdown()


def command_names(command: Any, prefix: str = "mlreg") -> list[str]:
    """Every command and group typer builds, read here on its own (not through the generator)."""
    children = getattr(command, "commands", {})
    return [prefix] + [
        name
        for child in sorted(children)
        if not children[child].hidden
        for name in command_names(children[child], f"{prefix} {child}")
    ]


def test_the_cli_reference_has_every_command_and_each_of_its_options(reference: str) -> None:
    entries = list(cli_reference.walk())
    names = [entry.name for entry in entries]
    assert names == command_names(cli_reference.root())
    assert {
        "mlreg init",
        "mlreg stack up",
        "mlreg promote",
        "mlreg store repair",
        "mlreg store unlock",
    } <= set(names)
    headings = {m.group(1): m.start() for m in re.finditer(r"^#+ `(mlreg[^`]*)`$", reference, re.M)}
    assert list(headings) == [entry.name for entry in entries]  # one section each, in the tree's order
    for entry in entries:
        start = headings[entry.name]
        end = min([at for at in headings.values() if at > start] or [len(reference)])
        body = reference[start:end]
        for param in entry.command.params:
            for flag in [*param.opts, *param.secondary_opts]:
                if flag.startswith("-"):
                    assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", body), (entry.name, flag)
        help_first_words = html.escape(" ".join((entry.command.help or "").split()[:4]), quote=False)
        assert help_first_words in body, (entry.name, help_first_words)


def test_the_cli_reference_is_made_at_each_build_never_checked_in(config: dict[str, Any]) -> None:
    assert config["hooks"] == ["cli_reference.py"]
    assert cli_reference.PAGE in nav_files(config["nav"])
    assert not (SITE / cli_reference.PAGE).exists()  # generated: a copy here would drift


def test_every_page_is_in_the_nav_and_the_build_is_strict(config: dict[str, Any]) -> None:
    pages = {page.relative_to(SITE).as_posix() for page in site_pages()}
    assert sorted(pages | {cli_reference.PAGE}) == sorted(nav_files(config["nav"]))
    assert config["strict"] is True
    assert config["theme"]["name"] == "material"


def test_shell_blocks_run_only_on_tutorial_pages_and_every_tutorial_shell_block_runs() -> None:
    for page in site_pages():
        tutorial = page.parent == tutorial_blocks.TUTORIALS
        for info, body in tutorial_blocks.fences(page.read_text(encoding="utf-8")):
            assert info, f"{page.name}: a fence without an info string ({body[:40]!r}): name its language"
            if info in tutorial_blocks.SHELL:
                # a tutorial's shell block always runs; elsewhere none looks as if it did
                runs = info in tutorial_blocks.RUN
                assert runs == tutorial, (
                    f"{page.name}: a ```{info} block (```bash/console run in tutorials only)"
                )
    steps = [step for page in tutorial_blocks.pages() for step in tutorial_blocks.steps(page)]
    texts = [page.read_text(encoding="utf-8") for page in tutorial_blocks.pages()]
    bash = [body for text in texts for info, body in tutorial_blocks.fences(text) if info == "bash"]
    dollars = [
        line
        for text in texts
        for info, body in tutorial_blocks.fences(text)
        if info == "console"
        for line in body.splitlines()
        if line.startswith("$ ")
    ]
    assert [step.command for step in steps if step.kind == "bash"] == bash  # every bash block, whole
    assert [f"$ {step.command}" for step in steps if step.kind == "console"] == dollars  # every command
    commands = [step.command for step in steps]
    assert "mlreg init . --from classifier.onnx" in commands
    assert commands[-1] == "mlreg stack down"
    assert all(step.expected for step in steps if step.kind == "console")  # each shows its output


def test_a_console_block_is_commands_and_the_output_each_prints() -> None:
    steps = tutorial_blocks.console("p.md", "$ mlreg a\none\n\n  two  spaced \n$ mlreg b\n")
    assert [(s.command, s.expected) for s in steps] == [
        ("mlreg a", ("one", "  two  spaced ")),
        ("mlreg b", ()),
    ]
    with pytest.raises(ValueError, match="starts with output"):
        tutorial_blocks.console("p.md", "output first\n$ mlreg a\n")
    step = steps[0]
    assert step.missing("x\ntwo   spaced\none\n") == []  # stdout and stderr: any order
    assert step.missing("one\n") == ["  two  spaced "]
    assert tutorial_blocks.matches(
        "iris 1 1 127.0.0.1:…: 1", "iris            1        1  127.0.0.1:49867: 1"
    )
    assert not tutorial_blocks.matches("iris 1 1 127.0.0.1:…: 1", "iris  1  1  127.0.0.1:49867: 2")


def test_the_exit_code_table_is_the_codes_the_cli_exits_with() -> None:
    from mlreg.cli.failures import INTERNAL_ERROR_EXIT, INTERRUPTED_EXIT
    from registry.errors import EXIT_CODES

    text = (SITE / "operations.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| (`(\w+)`|—) \|", text, re.M)
    table = {int(code): name for code, _, name in rows}
    assert {name: code for code, name in table.items() if name} == EXIT_CODES
    assert {0, 1, INTERNAL_ERROR_EXIT, INTERRUPTED_EXIT} <= set(table)
    assert list(table) == sorted(table)


def _keys(name: str) -> frozenset[str]:
    """A key set of the settings readers, from the module that defines it (wherever it lives now)."""
    for path in sorted((ROOT / "pipelines").rglob("*.py")):
        if re.search(rf"^{name} = ", path.read_text(encoding="utf-8"), re.M):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            return frozenset(getattr(importlib.import_module(module), name))
    raise AssertionError(f"no module of pipelines/ defines {name}")


def test_the_mlreg_toml_reference_names_every_key_an_environment_reads() -> None:
    environments = (SITE / "environments.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(\w+)` \|", environments, re.M))
    read = _keys("ENVIRONMENT_KEYS") | _policy_keys()
    undocumented = sorted(read - {"shadow"} - documented)  # shadow: its own page
    assert not undocumented, f"add a row for each key to docs/site_src/environments.md: {undocumented}"
    assert documented <= read, f"rows for keys the code does not read: {sorted(documented - read)}"
    shadow = (SITE / "shadow.md").read_text(encoding="utf-8")
    assert set(re.findall(r"^(\w+) = ", shadow, re.M)) == _keys("SHADOW_KEYS")


def _policy_keys() -> frozenset[str]:
    for path in sorted((ROOT / "pipelines").rglob("policy.py")):
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        if hasattr(module, "FLAT_CHECKS"):
            return frozenset(module.KEYS)
    raise AssertionError("no roll-out policy module under pipelines/")


def test_the_ui_page_shows_real_screenshots_that_exist() -> None:
    text = (SITE / "mlflow-ui.md").read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", text)
    assert images == [
        "assets/screenshots/image_model.png",
        "assets/screenshots/image_model-v2.png",
        "assets/screenshots/promotion-run.png",  # issue 48 item 6: the promotion run
        "assets/screenshots/refused-run.png",  # ... and a refused one
    ]
    for image in images:
        data = (SITE / image).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", image
        assert len(data) > 10_000, image
    browser = (ROOT / "tests" / "integration" / "test_browser.py").read_text(encoding="utf-8")
    assert "DOCS_SCREENSHOTS" in browser
    assert all(Path(image).name in browser for image in images)


def test_the_readme_keeps_the_two_commands_and_points_to_the_site() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make demo" in readme
    assert "make test" in readme
    assert "docs/mkdocs.yml" in readme
    assert "docs/site_src/tutorial/your-own-model.md" in readme
