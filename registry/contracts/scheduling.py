"""Scheduler rules of core ``ValidateModelConfig``: dynamic batching, sequence batching, ensembles."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from registry.contracts.config import model_config_pb2 as schema
from registry.contracts.findings import Finding, error, warning
from registry.contracts.repository import ModelEntry

CONTROL_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_END")
CORRID = "CONTROL_SEQUENCE_CORRID"
VALUE_FIELDS = ("int32_false_true", "fp32_false_true", "bool_false_true")
CORRID_TYPES = {"TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING"}
DELAY = 1  # ModelQueuePolicy.DELAY


def check_batching(entry: ModelEntry) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    mbs = config.max_batch_size
    if mbs < 0:
        yield error(
            "max-batch-size",
            entry.name,
            f"'max_batch_size' must be non-negative value for {entry.name}",
            "use 0 (no batching) or the largest batch the model accepts",
            actual=str(mbs),
        )
    if not config.HasField("dynamic_batching"):
        return
    if mbs == 0:
        yield warning(
            "dynamic-batching",
            entry.name,
            "dynamic batching is configured but max_batch_size is 0, so nothing is batched",
            "set max_batch_size > 0 or remove dynamic_batching",
            origin="mlreg",
        )
    yield from _preferred_sizes(entry, "dynamic batching preferred size", config.dynamic_batching)
    yield from _priorities(entry, config.dynamic_batching)
    yield from _preserve_ordering(entry, config.dynamic_batching)


def _preferred_sizes(entry: ModelEntry, what: str, batcher: Any) -> Iterator[Finding]:
    assert entry.config is not None
    mbs = entry.config.max_batch_size
    for size in batcher.preferred_batch_size:
        if size <= 0:
            yield error(
                "preferred-batch-size",
                entry.name,
                f"{what} must be positive for {entry.name}",
                "use sizes >= 1",
                actual=str(size),
            )
        elif size > mbs:
            yield error(
                "preferred-batch-size",
                entry.name,
                f"{what} must be <= max batch size for {entry.name}",
                f"lower it to at most {mbs} or raise max_batch_size",
                expected=f"<= {mbs}",
                actual=str(size),
            )


def _priorities(entry: ModelEntry, batching: Any) -> Iterator[Finding]:
    levels = batching.priority_levels
    if levels == 0:
        return
    policy_fix = f"key priority_queue_policy by levels 1..{levels}, or raise priority_levels"
    named = [
        (
            "default priority level must be",
            batching.default_priority_level,
            f"set default_priority_level between 1 and {levels}",
        ),
        *(
            ("priority queue policy must have priority level", level, policy_fix)
            for level in sorted(batching.priority_queue_policy)
        ),
    ]
    for what, level, fix in named:
        if level == 0 or level > levels:
            yield error(
                "priority",
                entry.name,
                f"{what} in range [1, {levels}] for {entry.name}",
                fix,
                expected=f"[1, {levels}]",
                actual=str(level),
            )


def _preserve_ordering(entry: ModelEntry, batching: Any) -> Iterator[Finding]:
    if not batching.preserve_ordering:
        return
    if batching.priority_levels > 1:
        yield error(
            "preserve-ordering",
            entry.name,
            f"Only one priority level is allowed when 'preserve_ordering' is true for {entry.name}",
            "set priority_levels to 0 or 1, or preserve_ordering: false",
            actual=str(batching.priority_levels),
        )
    policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
    if any(p.default_timeout_microseconds != 0 and p.timeout_action == DELAY for p in policies):
        yield error(
            "preserve-ordering",
            entry.name,
            f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true "
            f"for {entry.name}",
            "use timeout_action: REJECT, or preserve_ordering: false",
        )


def control_tensors(config: Any) -> set[str]:
    """The sequence batcher's control tensors: model inputs that config.input does not list."""
    if not config.HasField("sequence_batching"):
        return set()
    return {c.name for c in config.sequence_batching.control_input if c.name}


def check_sequence_batching(entry: ModelEntry) -> Iterator[Finding]:
    config = entry.config
    assert config is not None
    if not config.HasField("sequence_batching"):
        return
    batcher = config.sequence_batching
    if config.response_cache.enable:
        yield error(
            "sequence-batching",
            entry.name,
            f"Response Cache does not currently support model {entry.name} with sequence batching "
            "scheduler. Please disable the response cache.",
            "set response_cache { enable: false }",
        )
    yield from _control_names(entry, batcher)
    for control_kind in (*CONTROL_KINDS, CORRID):
        yield from _control_kind(entry, batcher, control_kind)
    if batcher.HasField("oldest"):
        yield from _preferred_sizes(entry, "sequence batching preferred batch size", batcher.oldest)
    if batcher.HasField("direct"):
        utilization = batcher.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            yield error(
                "sequence-batching",
                entry.name,
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {entry.name}",
                "set minimum_slot_utilization between 0 and 1",
                actual=str(utilization),
            )


def _control_names(entry: ModelEntry, batcher: Any) -> Iterator[Finding]:
    seen: set[str] = set()
    for control_input in batcher.control_input:
        name = control_input.name
        if not name:
            yield error(
                "sequence-control",
                entry.name,
                f"sequence batching control tensor must have a name for {entry.name}",
                "give every control_input a name",
            )
        elif name in seen:
            yield error(
                "sequence-control",
                entry.name,
                f"sequence batching control tensor '{name}' is specified for multiple control kinds "
                f"for {entry.name}",
                "list each control tensor once, with one control kind",
                tensor=name,
            )
        seen.add(name)


def _control_kind(entry: ModelEntry, batcher: Any, control_kind: str) -> Iterator[Finding]:
    model_config_pb2 = schema()

    kinds = model_config_pb2.ModelSequenceBatching.Control.Kind
    found = [
        (control_input.name, control)
        for control_input in batcher.control_input
        for control in control_input.control
        if kinds.Name(control.kind) == control_kind
    ]
    if len(found) > 1:
        yield error(
            "sequence-control",
            entry.name,
            f"sequence batching specifies multiple {control_kind} tensors for {entry.name}",
            f"keep one control_input of kind {control_kind}",
            tensor=found[1][0],
        )
    for name, control in found[:1]:
        given = [f for f in VALUE_FIELDS if len(getattr(control, f))]
        if control_kind == CORRID:
            yield from _corrid(entry, name, control, given)
        else:
            yield from _boolean_control(entry, name, control, given, control_kind)


def _boolean_control(
    entry: ModelEntry, name: str, control: Any, given: list[str], control_kind: str
) -> Iterator[Finding]:
    where = f"for {control_kind} for {entry.name}"
    if not given:
        yield error(
            "sequence-control",
            entry.name,
            f"sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' {where}",
            f"add int32_false_true: [ 0, 1 ] to the control of '{name}'",
            tensor=name,
        )
    elif len(given) > 1:
        yield error(
            "sequence-control",
            entry.name,
            "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
            f"and 'bool_false_true' {where}",
            f"keep one of {', '.join(given)} in the control of '{name}'",
            tensor=name,
        )
    elif len(getattr(control, given[0])) != 2:
        yield error(
            "sequence-control",
            entry.name,
            f"sequence batching control '{given[0]}' must have exactly 2 entries {where}",
            f"give {given[0]} two values: [ false_value, true_value ]",
            tensor=name,
        )


def _corrid(entry: ModelEntry, name: str, control: Any, given: list[str]) -> Iterator[Finding]:
    model_config_pb2 = schema()

    if given:
        yield error(
            "sequence-control",
            entry.name,
            "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for {CORRID} for {entry.name}",
            f"remove {', '.join(given)} and give a data_type to '{name}'",
            tensor=name,
        )
    data_type = model_config_pb2.DataType.Name(control.data_type)
    if data_type not in CORRID_TYPES:
        yield error(
            "sequence-control",
            entry.name,
            f"unexpected data type for control {CORRID} for {entry.name}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
            f"set data_type: TYPE_UINT64 on the control of '{name}'",
            tensor=name,
            actual=data_type,
        )


def check_scheduler_kind(entry: ModelEntry) -> Iterator[Finding]:
    """ensemble_scheduling only on ensembles, and every ensemble has it; response-cache conflicts."""
    config = entry.config
    assert config is not None
    is_ensemble = entry.resolved.platform == "ensemble"
    if config.HasField("ensemble_scheduling") and not is_ensemble:
        yield error(
            "ensemble-scheduling",
            entry.name,
            f"ensemble scheduling cannot be set for model '{entry.name}' whose platform is not ensemble",
            'remove ensemble_scheduling, or make the model an ensemble (platform: "ensemble")',
        )
    elif is_ensemble and not config.HasField("ensemble_scheduling"):
        yield error(
            "ensemble-scheduling",
            entry.name,
            f"ensemble scheduling must be set for ensemble {entry.name} whose platform is ensemble",
            "add ensemble_scheduling { step [ ... ] }",
        )
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        yield error(
            "response-cache",
            entry.name,
            f"Response Cache does not currently support model {entry.name} with 'decoupled' "
            "transaction policy. Please disable the response cache.",
            "set response_cache { enable: false }",
        )
