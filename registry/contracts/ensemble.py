"""Ensemble checks, in Triton's two stages.

1. The config alone (core ``ValidateEnsembleSchedulingConfig``): steps, maps and the data flow built
   from the steps' own maps.  A missing member does not change this stage, so it causes no cascade.
2. Against the members' configs (``ensemble_utils.cc`` ``ValidateEnsembleConfig``): members that are
   not available (said once), batch sizes, map keys and tensor consistency.  A batching ensemble may
   hold a non-batching member "as long as the expanded shapes are consistent": Triton accepts a tensor
   when its dims *or* its full shapes agree.  When only the dims agree the request fails at inference
   (``[1,1]`` sent where ``[1]`` is taken): mlreg adds that as its own finding, labelled ``[mlreg]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from registry.contracts.config import data_type_name
from registry.contracts.findings import Finding, error, shape_text, warning
from registry.contracts.repository import ModelEntry, Repository
from registry.contracts.rules import kind


@dataclass(frozen=True)
class Port:
    """An ensemble tensor as some model declares it (Triton's ``TensorNode``)."""

    owner: str
    name: str
    dtype: str
    dims: tuple[int, ...]
    batching: bool

    @property
    def shape(self) -> tuple[int, ...]:
        """The full shape, batch dimension included."""
        return ((-1,) if self.batching else ()) + self.dims


def _port(entry: ModelEntry, tensor: Any, use_reshape: bool = False) -> Port:
    assert entry.config is not None
    dims = tensor.reshape.shape if use_reshape and tensor.HasField("reshape") else tensor.dims
    return Port(
        entry.name,
        tensor.name,
        data_type_name(tensor.data_type),
        tuple(int(d) for d in dims),
        entry.config.max_batch_size > 0,
    )


def _compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Triton's CompareDimsWithWildcard."""
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def check_ensembles(repo: Repository) -> Iterator[Finding]:
    for entry in repo.models.values():
        if entry.config is not None and kind(entry) == "ensemble":
            yield from check_ensemble(entry, repo)
    yield from check_cycles(repo)


def check_ensemble(entry: ModelEntry, repo: Repository) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    if not config.HasField("ensemble_scheduling"):
        return  # reported by the scheduler rule
    yield from check_scheduling(entry)
    if config.ensemble_scheduling.step:
        yield from check_members(entry, repo)


# -- stage 1: the ensemble's own config ---------------------------------------------------------


@dataclass
class _Node:
    written: bool = False
    ready: bool = False
    readers: list[int] = field(default_factory=list)
    prev: list[str] = field(default_factory=list)
    next: list[str] = field(default_factory=list)


def check_scheduling(entry: ModelEntry) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    name = entry.name
    if config.HasField("optimization"):
        yield error(
            "ensemble-scheduling",
            name,
            f"optimization should not be specified for ensemble '{name}'",
            "remove optimization",
        )
    if len(config.model_warmup):
        yield error(
            "ensemble-scheduling",
            name,
            f"model_warmup can not be specified for ensemble '{name}'",
            "warm up the member models instead",
        )
    steps = list(config.ensemble_scheduling.step)
    if not steps:
        yield error(
            "ensemble-steps",
            name,
            f"must specify 'step' for ensemble '{name}'",
            "add ensemble_scheduling { step [ ... ] }",
        )
        return
    graph: dict[str, _Node] = {}
    for index, step in enumerate(steps):
        yield from _link_step(name, index, step, graph)
    yield from _check_flow(entry, graph)


def _link_step(name: str, index: int, step: Any, graph: dict[str, _Node]) -> Iterator[Finding]:
    where = f"step {index} of ensemble '{name}'"
    for field_name, value in (("model_name", step.model_name), ("input_map", step.input_map)):
        if not value:
            yield error("ensemble-map", name, f"must specify '{field_name}' in {where}", f"set {field_name}")
    if not step.output_map:
        yield error("ensemble-map", name, f"must specify 'output_map' in {where}", "map the model's outputs")
    written = []
    for tensor in step.output_map.values():
        node = graph.setdefault(tensor, _Node())
        if node.written:
            yield error(
                "ensemble-map",
                name,
                f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' "
                f"step {index}",
                "give each step output its own ensemble tensor name",
                tensor=tensor,
            )
            continue
        node.written = True
        written.append(tensor)
    for tensor in step.input_map.values():
        node = graph.setdefault(tensor, _Node())
        node.readers.append(index)
        for out in written:
            graph[out].prev.append(tensor)
            node.next.append(out)


def _propagate(graph: dict[str, _Node], inputs: list[str]) -> None:
    queue = [t for t in inputs if t in graph]
    for tensor in queue:
        graph[tensor].ready = True
    while queue:
        for nxt in graph[queue.pop(0)].next:
            node = graph[nxt]
            if not node.ready and all(graph[p].ready for p in node.prev):
                node.ready = True
                queue.append(nxt)


def _check_flow(entry: ModelEntry, graph: dict[str, _Node]) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    name = entry.name
    inputs = [t.name for t in config.input]
    outputs = {t.name for t in config.output}
    for tensor in inputs:
        if tensor not in graph:
            yield error(
                "ensemble-input",
                name,
                f"ensemble input '{tensor}' for ensemble {name}' is not used",
                f"map '{tensor}' in some step's input_map, or remove the input",
                tensor=tensor,
            )
    _propagate(graph, inputs)
    for tensor in sorted(outputs):
        yield from _check_output(name, tensor, graph)
    for tensor, node in graph.items():
        if tensor in outputs or (node.ready and node.next):
            continue
        if not node.ready and not node.written and tensor not in inputs:
            why = ": it is read by a step but is neither an ensemble input nor written by any step"
            fix = f"declare '{tensor}' as an ensemble input or map a step output to it"
        elif not node.ready:
            why = ": it is written by a step whose inputs are never all written"
            fix = "connect that step's inputs to ensemble inputs or other steps' outputs"
        else:
            why = ": it is written but never read"
            fix = "read the tensor in some step's input_map, make it an ensemble output, or remove it"
        yield error(
            "ensemble-map",
            name,
            f"ensemble tensor '{tensor}' is unused in ensemble '{name}'{why}",
            fix,
            tensor=tensor,
        )


def _check_output(name: str, tensor: str, graph: dict[str, _Node]) -> Iterator[Finding]:
    node = graph.get(tensor)
    if node is None:
        yield error(
            "ensemble-output",
            name,
            f"ensemble output '{tensor}' for ensemble {name}' is not used",
            f"map some step's output to '{tensor}' in its output_map",
            tensor=tensor,
        )
        return
    if node.ready:
        return
    source, seen = tensor, set()
    while True:
        pending = [p for p in graph[source].prev if not graph[p].ready and p not in seen]
        if not pending:
            break
        source = pending[0]
        seen.add(source)
    detail = (
        f": at least one of its depending tensors, '{source}', is not connected" if source != tensor else ""
    )
    yield error(
        "ensemble-output",
        name,
        f"output '{tensor}' for ensemble '{name}' is not written{detail}",
        f"map some step's output to '{tensor}' and connect that step's inputs",
        tensor=tensor,
    )


# -- stage 2: against the members ----------------------------------------------------------------


def check_members(entry: ModelEntry, repo: Repository) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    name = entry.name
    steps = list(config.ensemble_scheduling.step)
    missing = sorted({s.model_name for s in steps if s.model_name not in repo.models})
    if missing:
        yield error(
            "ensemble-member",
            name,
            f"ensemble {name} contains models that are not available or ambiguous: {', '.join(missing)}",
            "add the model(s) to the repository or fix the steps' model_name",
        )
    unreadable = sorted({s.model_name for s in steps if s.model_name in repo.models} - set(_readable(repo)))
    if unreadable:
        yield warning(
            "ensemble-skipped",
            name,
            f"the steps of ensemble '{name}' running {', '.join(unreadable)} are not checked against "
            "the model: its config cannot be read",
            "fix that config first",
            origin="mlreg",
        )
    nodes: dict[str, Port] = {}
    for tensor in config.input:
        nodes.setdefault(tensor.name, _port(entry, tensor, use_reshape=True))
    for tensor in config.output:
        nodes.setdefault(tensor.name, _port(entry, tensor, use_reshape=True))
    for index, step in enumerate(steps):
        member = repo.models.get(step.model_name)
        if member is not None and member.config is not None:
            yield from _check_step(entry, member, index, step, nodes)


def _readable(repo: Repository) -> list[str]:
    return [n for n, e in repo.models.items() if e.config is not None]


def _check_step(
    entry: ModelEntry, member: ModelEntry, index: int, step: Any, nodes: dict[str, Port]
) -> Iterator[Finding]:
    yield from _check_version(entry, member, index, step)
    yield from _check_batch_size(entry, member)
    yield from _check_step_inputs(entry, member, step, nodes)
    yield from _check_step_outputs(entry, member, step, nodes)


def _check_version(entry: ModelEntry, member: ModelEntry, index: int, step: Any) -> Iterator[Finding]:
    unexported = member.exporter is not None and not member.versions()
    if step.model_version > 0 and not unexported and str(step.model_version) not in member.versions():
        yield error(
            "ensemble-version",
            entry.name,
            f"step {index} ({step.model_name}) of ensemble '{entry.name}' pins version {step.model_version}, "
            f"which '{step.model_name}' does not have",
            f"use one of its versions ({', '.join(member.versions()) or 'none'}) or -1 for latest",
            version=str(step.model_version),
        )


def _check_batch_size(entry: ModelEntry, member: ModelEntry) -> Iterator[Finding]:
    assert entry.config is not None
    assert member.config is not None
    mbs, member_mbs = entry.config.max_batch_size, member.config.max_batch_size
    if 0 < member_mbs < mbs:
        yield error(
            "ensemble-batch",
            entry.name,
            f"ensemble {entry.name} allows maximum batch size {mbs}, but it contains model "
            f"{member.name} which only allows maximum batch size to be {member_mbs}",
            f"set max_batch_size: {mbs} (or more) in {member.name}/config.pbtxt, or lower "
            f"the ensemble's max_batch_size",
            expected=f">= {mbs}",
            actual=str(member_mbs),
        )


def _check_step_inputs(
    entry: ModelEntry, member: ModelEntry, step: Any, nodes: dict[str, Port]
) -> Iterator[Finding]:
    assert member.config is not None
    name = entry.name
    member_inputs = {t.name: t for t in member.config.input}
    for key, tensor in step.input_map.items():
        if key not in member_inputs:
            yield _unknown_key(name, member, "input", (key, tensor), member_inputs)
    for key, declared in member_inputs.items():
        if key not in step.input_map:
            if not declared.optional:
                yield error(
                    "ensemble-map",
                    name,
                    f"in ensemble {name}, input {key} in model {member.name} is not mapped to any "
                    "ensemble tensors",
                    f'add input_map {{ key: "{key}" value: "<tensor>" }} to the step of {member.name}',
                    tensor=key,
                )
            continue
        yield from _register(name, step.input_map[key], _port(member, declared), nodes)


MAPPED = {"input": "is mapping to non-existing input", "output": "is mapped from non-existing output"}


def _unknown_key(
    name: str, member: ModelEntry, side: str, mapped: tuple[str, str], declared: dict[str, Any]
) -> Finding:
    """A step's ``input_map``/``output_map`` key (``side``) naming no tensor of ``member``."""
    key, tensor = mapped
    return error(
        "ensemble-map",
        name,
        f"in ensemble {name}, ensemble tensor {tensor} {MAPPED[side]} {key} in model {member.name}",
        f"use an {side} of {member.name} as {side}_map key: {', '.join(sorted(declared))}",
        tensor=key,
    )


def _check_step_outputs(
    entry: ModelEntry, member: ModelEntry, step: Any, nodes: dict[str, Port]
) -> Iterator[Finding]:
    assert member.config is not None
    name = entry.name
    member_outputs = {t.name: t for t in member.config.output}
    for key, tensor in step.output_map.items():
        if key not in member_outputs:
            yield _unknown_key(name, member, "output", (key, tensor), member_outputs)
            continue
        yield from _register(name, tensor, _port(member, member_outputs[key]), nodes)


def _register(ensemble: str, tensor: str, port: Port, nodes: dict[str, Port]) -> Iterator[Finding]:
    """Triton's ValidateTensorConsistency against the tensor's first declaration, and mlreg's full-shape
    check that Triton leaves to inference."""
    first = nodes.setdefault(tensor, port)
    if first is port:
        return
    prefix = f"in ensemble {ensemble}, ensemble tensor {tensor}: "
    if first.dtype != port.dtype:
        yield error(
            "ensemble-dtype",
            ensemble,
            f"{prefix}inconsistent data type: TYPE_{first.dtype} is inferred from model {first.owner} while "
            f"TYPE_{port.dtype} is inferred from model {port.owner}",
            "make both sides declare the same data_type",
            tensor=tensor,
            expected=f"TYPE_{first.dtype}",
            actual=f"TYPE_{port.dtype}",
        )
    if not _compatible(first.dims, port.dims) and not _compatible(first.shape, port.shape):
        yield error(
            "ensemble-shape",
            ensemble,
            f"{prefix}inconsistent shape: {shape_text(first.shape)} is inferred from model {first.owner} "
            f"while {shape_text(port.shape)} is inferred from model {port.owner}",
            "make the dims agree; a batching model (max_batch_size > 0) adds a leading -1",
            tensor=tensor,
            expected=shape_text(first.shape),
            actual=shape_text(port.shape),
        )
    elif not _compatible(first.shape, port.shape):
        yield _batch_shape_fault(ensemble, tensor, first, port)


def _batch_shape_fault(ensemble: str, tensor: str, first: Port, port: Port) -> Finding:
    batching, single = (first, port) if first.batching else (port, first)
    return error(
        "ensemble-shape",
        ensemble,
        f"in ensemble {ensemble}, tensor '{tensor}' has full shape {shape_text(first.shape)} in "
        f"{first.owner} ('{first.name}') but {shape_text(port.shape)} in {port.owner} ('{port.name}'): "
        f"Triton loads this, but inference fails: {batching.owner} batches (its full shape has the "
        f"batch dimension) and {single.owner} does not",
        f"set max_batch_size > 0 in {single.owner}/config.pbtxt (its dims stay without the batch "
        f"dimension), or put the batch dimension in its dims: {shape_text((-1, *single.dims))}",
        tensor=tensor,
        expected=shape_text(first.shape),
        actual=shape_text(port.shape),
        origin="mlreg",
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
