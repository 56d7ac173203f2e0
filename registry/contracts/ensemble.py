"""Ensemble wiring checks (core ``ValidateEnsembleSchedulingConfig`` and ``ensemble_utils.cc``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from registry.contracts.config import data_type_name, full_shape
from registry.contracts.findings import Finding, error, shape_text, warning
from registry.contracts.repository import ModelEntry, Repository
from registry.contracts.rules import kind


@dataclass(frozen=True)
class Port:
    """One end of an ensemble edge: a tensor as some model declares it."""

    owner: str
    name: str
    dtype: str
    shape: tuple[int, ...]  # full shape, batch dimension included


def _port(entry: ModelEntry, tensor: Any) -> Port:
    assert entry.config is not None
    return Port(
        entry.name, tensor.name, data_type_name(tensor.data_type), full_shape(entry.config, list(tensor.dims))
    )


def _compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def check_ensembles(repo: Repository) -> Iterator[Finding]:
    for entry in repo.models.values():
        if entry.config is not None and kind(entry) == "ensemble":
            yield from check_ensemble(entry, repo)
    yield from check_cycles(repo)


def check_ensemble(entry: ModelEntry, repo: Repository) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    name = entry.name
    steps = list(config.ensemble_scheduling.step)
    if not steps:
        yield error(
            "ensemble-steps",
            name,
            f"must specify one or more 'step's for ensemble '{name}'",
            "add ensemble_scheduling { step [ ... ] }",
        )
        return
    unreadable = sorted(
        {
            s.model_name
            for s in steps
            if s.model_name in repo.models and repo.models[s.model_name].config is None
        }
    )
    if unreadable:
        yield warning(
            "ensemble-skipped",
            name,
            f"wiring of ensemble '{name}' not checked: the config of {', '.join(unreadable)} cannot be read",
            "fix that config first",
        )
        return
    produced: dict[str, Port] = {t.name: _port(entry, t) for t in config.input}
    writers: dict[str, int] = {}
    consumers: dict[str, list[Port]] = {}
    for index, step in enumerate(steps):
        yield from _check_step(entry, repo, index, step, produced, writers, consumers)
    yield from _check_edges(entry, produced, consumers)
    outputs = {t.name: _port(entry, t) for t in config.output}
    for out_name, port in outputs.items():
        if out_name not in writers:
            yield error(
                "ensemble-output",
                name,
                f"no data will be written to ensemble output '{out_name}' for ensemble '{name}'",
                f"map some step's output to '{out_name}' in its output_map",
                tensor=out_name,
            )
        elif out_name in produced:
            yield from _edge(name, produced[out_name], port, out_name)
    for in_name in (t.name for t in config.input):
        if in_name not in consumers:
            yield error(
                "ensemble-input",
                name,
                f"ensemble input '{in_name}' for ensemble {name}' not used",
                f"map '{in_name}' in some step's input_map, or remove the input",
                tensor=in_name,
            )
    for tensor in writers:
        if tensor not in consumers and tensor not in outputs:
            yield warning(
                "unused-tensor",
                name,
                f"ensemble tensor '{tensor}' is written but never read",
                "remove the output_map entry or use the tensor",
                tensor=tensor,
            )


def _check_step(  # noqa: C901 - to split
    entry: ModelEntry,
    repo: Repository,
    index: int,
    step: Any,
    produced: dict[str, Port],
    writers: dict[str, int],
    consumers: dict[str, list[Port]],
) -> Iterator[Finding]:
    name = entry.name
    assert entry.config is not None
    member = repo.models.get(step.model_name)
    where = f"step {index} ({step.model_name}) of ensemble '{name}'"
    if member is None or member.config is None:
        yield error(
            "ensemble-member",
            name,
            f"ensemble {name} contains models that are not available: {step.model_name}",
            f"add the model '{step.model_name}' to the repository or fix the step's model_name",
        )
        return
    unexported = member.exporter is not None and not member.versions()
    if step.model_version > 0 and not unexported and str(step.model_version) not in member.versions():
        yield error(
            "ensemble-version",
            name,
            f"{where} pins version {step.model_version}, which '{step.model_name}' does not have",
            f"use one of its versions ({', '.join(member.versions()) or 'none'}) or -1 for latest",
            version=str(step.model_version),
        )
    mbs, member_mbs = entry.config.max_batch_size, member.config.max_batch_size
    if mbs > 0 and member_mbs < mbs:
        yield error(
            "ensemble-batch",
            name,
            f"ensemble {name} allows maximum batch size {mbs}, but it contains model "
            f"{step.model_name} which only allows maximum batch size to be {member_mbs}",
            f"set max_batch_size: {mbs} (or more) in {step.model_name}/config.pbtxt, or lower "
            f"the ensemble's max_batch_size",
            expected=f">= {mbs}",
            actual=str(member_mbs),
        )
    if not step.input_map:
        yield error("ensemble-map", name, f"must specify 'input_map' in {where}", "map the model's inputs")
    if not step.output_map:
        yield error("ensemble-map", name, f"must specify 'output_map' in {where}", "map the model's outputs")
    member_inputs = {t.name: t for t in member.config.input}
    member_outputs = {t.name: t for t in member.config.output}
    for key, tensor in step.input_map.items():
        if key not in member_inputs:
            yield error(
                "ensemble-map",
                name,
                f"in ensemble {name}, input '{key}' of {where} is not an input of the model; "
                f"allowed inputs are: {', '.join(sorted(member_inputs))}",
                "use the member model's input names as input_map keys",
                tensor=key,
            )
            continue
        consumers.setdefault(tensor, []).append(_port(member, member_inputs[key]))
    for key, tensor in member_inputs.items():
        if key not in step.input_map and not tensor.optional:
            yield error(
                "ensemble-map",
                name,
                f"in ensemble {name}, input '{key}' of {where} is not mapped",
                f'add input_map {{ key: "{key}" value: "<tensor>" }}',
                tensor=key,
            )
    for key, tensor in step.output_map.items():
        if key not in member_outputs:
            yield error(
                "ensemble-map",
                name,
                f"in ensemble {name}, output '{key}' of {where} is not an output of the model; "
                f"allowed outputs are: {', '.join(sorted(member_outputs))}",
                "use the member model's output names as output_map keys",
                tensor=key,
            )
            continue
        if tensor in writers or any(t.name == tensor for t in entry.config.input):
            yield error(
                "ensemble-map",
                name,
                f"ensemble tensor '{tensor}' can appear in an output map only once for "
                f"ensemble '{name}' step {index}",
                "give each step output its own ensemble tensor name",
                tensor=tensor,
            )
            continue
        writers[tensor] = index
        produced[tensor] = _port(member, member_outputs[key])


def _check_edges(
    entry: ModelEntry, produced: dict[str, Port], consumers: dict[str, list[Port]]
) -> Iterator[Finding]:
    for tensor, ports in consumers.items():
        source = produced.get(tensor)
        if source is None:
            yield error(
                "ensemble-map",
                entry.name,
                f"ensemble tensor '{tensor}' of ensemble '{entry.name}' is read by "
                f"{', '.join(p.owner for p in ports)} but is neither an ensemble input nor "
                "written by any step",
                f"declare '{tensor}' as an ensemble input or map a step output to it",
                tensor=tensor,
            )
            continue
        for port in ports:
            yield from _edge(entry.name, source, port, tensor)


def _edge(ensemble: str, source: Port, target: Port, tensor: str) -> Iterator[Finding]:
    if source.dtype != target.dtype:
        yield error(
            "ensemble-dtype",
            ensemble,
            f"in ensemble {ensemble}, tensor '{tensor}' is TYPE_{source.dtype} from "
            f"{source.owner} ('{source.name}') but {target.owner} ('{target.name}') "
            f"expects TYPE_{target.dtype}",
            "make both sides declare the same data_type",
            tensor=tensor,
            expected=f"TYPE_{target.dtype}",
            actual=f"TYPE_{source.dtype}",
        )
    if not _compatible(source.shape, target.shape):
        yield error(
            "ensemble-shape",
            ensemble,
            f"in ensemble {ensemble}, tensor '{tensor}' has shape {shape_text(source.shape)} "
            f"from {source.owner} ('{source.name}') but {target.owner} ('{target.name}') "
            f"expects {shape_text(target.shape)} (full shapes, batch dimension included)",
            "make the dims agree; a batching model (max_batch_size > 0) adds a leading -1",
            tensor=tensor,
            expected=shape_text(target.shape),
            actual=shape_text(source.shape),
        )


def check_cycles(repo: Repository) -> Iterator[Finding]:
    """Ensembles that (through nested ensembles) contain themselves."""
    graph = {
        e.name: [s.model_name for s in e.config.ensemble_scheduling.step]
        for e in repo.models.values()
        if e.config is not None and kind(e) == "ensemble"
    }
    reported: set[str] = set()
    for start in graph:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for child in graph.get(node, []):
                if child == start and start not in reported:
                    reported.update(path)
                    yield error(
                        "ensemble-cycle",
                        start,
                        f"circular dependency between ensembles: {' -> '.join([*path, start])}",
                        "an ensemble must not contain itself, directly or through others",
                    )
                elif child in graph and child not in path:
                    stack.append((child, [*path, child]))
