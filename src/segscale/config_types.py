"""Config values of the wrong kind, found from the annotations of what they configure.

Every config node with a ``_target_`` is checked against the parameter annotations of
the callable it names, before anything is built: ``trainer.max_epochs=abc`` is refused
with a message that names the key, instead of failing inside Lightning with a traceback.

Values are checked by *kind*, not by exact type, because annotations are often stricter
than what works (``EarlyStopping``'s ``patience: int`` takes ``.inf`` for "never stop").
The kinds are number (int and float; a bool is not a number), bool, string, null, list
and mapping. An annotation admits the kinds of its members (``Optional``, ``Union``,
``X | None``); ``Literal`` admits exactly its values; the items of a list (and the
values of a mapping) are checked against the item annotation. ``Any``, callables and
other classes admit anything, and so does a nested node with a ``_target_`` of its own
(it builds an object). Keys that are missing (``???``) or interpolations that do not
resolve yet are left to Hydra.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import (
    Collection,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    MutableSequence,
    Sequence,
)
from types import NoneType, UnionType
from typing import Any, Literal, NamedTuple, Union, get_args, get_origin

from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from segscale.config_schema import plain
from segscale.errors import ConfigError

_LISTS = (list, tuple, Sequence, MutableSequence, ListConfig)
_MAPPINGS = (dict, Mapping, MutableMapping, DictConfig)
_NUMBERS = (int, float, complex)
_UNRESOLVED = object()
"""A value that is missing or does not resolve yet: Hydra reports it, not this check."""

_PHRASES = {
    "null": ("null",),
    "bool": ("true", "false"),
    "number": ("a number",),
    "string": ("a string",),
}
_PLURALS = {"null": "nulls", "bool": "true/false values", "number": "numbers", "string": "strings"}


class KwargsReceiver(NamedTuple):
    """Where one of our builders passes its ``**kwargs``: ``choices[config[key]]``.

    ``choices`` is the dotted path of a name → callable mapping, resolved when checked;
    ``lowercase``: the builder looks the name up in lower case.
    """

    key: str
    choices: str
    lowercase: bool = False


KWARGS_RECEIVERS: dict[str, KwargsReceiver] = {
    # optimizer.momentum, .betas, .eps, ... go to the torch optimizer of the solver.
    "segscale.models.optim.build_optimizer": KwargsReceiver(
        "solver", "segscale.models.optim.SOLVERS"
    ),
    # model.decoder_channels, .encoder_depth, ... go to the smp architecture.
    "segscale.models.networks.build_network": KwargsReceiver(
        "arch", "segmentation_models_pytorch.MODEL_ARCHITECTURES_MAPPING", lowercase=True
    ),
}
"""Our builders whose extra keys go on to another callable, checked against that one."""


def check_types(cfg: DictConfig, filled_in: Collection[str] = ()) -> None:
    """Raise ``ConfigError`` for the first value whose kind its parameter does not admit.

    ``filled_in`` lists dotted keys that the caller replaces when it builds, whatever
    the config holds (``model.in_channels: null`` is filled in from the images).
    """
    key: Any  # a DictConfig key: str, or bytes, int, float, bool or Enum
    for path, node in target_nodes(cfg):
        parameters = target_parameters(node)
        for key in node:
            dotted = f"{path}.{key}" if path else str(key)
            if str(key).startswith("_") or key not in parameters or dotted in filled_in:
                continue
            value = _resolved(node, key)
            if value is not _UNRESOLVED and not admits(parameters[key], value):
                raise ConfigError(
                    f"{dotted}={plain(value, resolve=False)!r} is not allowed: "
                    f"expected {expected(parameters[key])}"
                )


def target_nodes(node: Any, path: str = "") -> Iterator[tuple[str, DictConfig]]:
    """Every node with a ``_target_`` in ``node``, at any depth, with its dotted key."""
    if isinstance(node, DictConfig):
        if "_target_" in node:
            yield path, node
        keys: list[Any] = list(node.keys())
        names = [f"{path}.{key}" if path else str(key) for key in keys]
    elif isinstance(node, ListConfig):
        keys = list(range(len(node)))
        names = [f"{path}[{i}]" for i in keys]
    else:
        return
    for key, name in zip(keys, names, strict=True):
        # An interpolated node is walked where it is defined, under its own key.
        if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
            continue
        yield from target_nodes(node[key], name)


def target_parameters(node: DictConfig) -> dict[str, Any]:
    """Annotation of each keyword parameter that ``node``'s ``_target_`` takes.

    Empty when the target cannot be imported (Hydra reports that when it builds) or its
    annotations cannot be evaluated. For our builders in ``KWARGS_RECEIVERS``, keys they
    pass on come with the annotations of the callable that receives them.
    """
    target = _resolved(node, "_target_")
    if not isinstance(target, str):
        return {}
    try:
        function = get_object(target)
    except (ImportError, ValueError):
        return {}
    parameters = _annotations(function)
    receiver = KWARGS_RECEIVERS.get(target)
    if receiver is not None:
        parameters = {**_annotations(_receiver(receiver, node)), **parameters}
    return parameters


def _receiver(receiver: KwargsReceiver, node: DictConfig) -> Any:
    name = _resolved(node, receiver.key) if receiver.key in node else _UNRESOLVED
    if not isinstance(name, str):
        return None
    try:
        choices = get_object(receiver.choices)
    except (ImportError, ValueError):
        return None
    return choices.get(name.lower() if receiver.lowercase else name)


def _annotations(function: Any) -> dict[str, Any]:
    """Annotations of the keyword parameters of ``function`` (a class: its ``__init__``)."""
    if function is None:
        return {}
    try:
        signature = inspect.signature(function)
        hints = typing.get_type_hints(function.__init__ if inspect.isclass(function) else function)
    except (NameError, TypeError, AttributeError, ValueError):
        # Annotations naming what only a type checker imports, or no signature at all.
        return {}
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        name: hints[name]
        for name, parameter in signature.parameters.items()
        if parameter.kind in keyword and name in hints
    }


def admits(annotation: Any, value: Any) -> bool:
    """Whether a config ``value`` is of a kind that ``annotation`` admits."""
    if _builds_object(value):
        return True
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        return any(admits(member, value) for member in get_args(annotation))
    if origin is Literal:
        return any(_same_literal(value, literal) for literal in get_args(annotation))
    kind = kind_of(value)
    primitive = _primitive_kind(annotation)
    if kind is None:
        return True
    if primitive is not None:
        return kind == primitive
    if (origin or annotation) in _LISTS:
        item = _item_annotation(annotation)
        return kind == "list" and (item is None or _admits_items(item, value, range(len(value))))
    if (origin or annotation) in _MAPPINGS:
        args = get_args(annotation)
        return kind == "mapping" and (len(args) != 2 or _admits_items(args[1], value, value))
    return True  # Any, callables, classes: anything may be what they take


def _admits_items(annotation: Any, container: Any, keys: Iterable[Any]) -> bool:
    """Whether every item of ``container`` that resolves is admitted by ``annotation``."""
    items = (_resolved(container, key) for key in keys)
    return all(item is _UNRESOLVED or admits(annotation, item) for item in items)


def expected(annotation: Any) -> str:
    """What ``annotation`` admits, in plain words: ``a number or null``."""
    phrases: list[str] = []
    literals: list[Any] = []
    for entry in _phrases(annotation):
        if isinstance(entry, str):
            phrases.append(entry)
            continue
        if not literals:  # every Literal member's values, in one phrase, where the first is
            phrases.append("")
        literals += entry
    shown = repr(literals[0]) if len(literals) == 1 else f"one of {literals}"
    phrases = list(dict.fromkeys(p or shown for p in phrases))
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " or " + phrases[-1]


def kind_of(value: Any) -> str | None:
    """The kind of a config value: number, bool, string, null, list or mapping."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (ListConfig, list, tuple)):
        return "list"
    if isinstance(value, (DictConfig, dict)):
        return "mapping"
    return None


def _phrases(annotation: Any) -> list[str | tuple[Any, ...]]:
    """Phrases for what ``annotation`` admits; a Literal's values come as a tuple."""
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        return [phrase for member in get_args(annotation) for phrase in _phrases(member)]
    if origin is Literal:
        return [get_args(annotation)]
    primitive = _primitive_kind(annotation)
    if primitive is not None:
        return list(_PHRASES[primitive])
    if (origin or annotation) in _LISTS:
        return [_list_phrase(_item_annotation(annotation))]
    if (origin or annotation) in _MAPPINGS:
        return ["a mapping"]
    return ["anything"]


def _list_phrase(item: Any) -> str:
    if item is None:
        return "a list"
    members = get_args(item) if get_origin(item) in (Union, UnionType) else (item,)
    kinds = [_primitive_kind(member) for member in members]
    if all(kinds):
        return "a list of " + " or ".join(dict.fromkeys(_PLURALS[k] for k in kinds if k))
    return f"a list whose items are each {expected(item)}"


def _primitive_kind(annotation: Any) -> str | None:
    if annotation is None or annotation is NoneType:
        return "null"
    if annotation is bool:
        return "bool"
    if annotation in _NUMBERS:
        return "number"
    if annotation is str:
        return "string"
    return None


def _item_annotation(annotation: Any) -> Any:
    """The annotation of a list's items; ``None`` when it says nothing about them."""
    args = [a for a in get_args(annotation) if a is not Ellipsis]
    if not args:
        return None
    # tuple[A, B] takes A then B: each item is checked against either.
    return args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007 (built at runtime)


def _same_literal(value: Any, literal: Any) -> bool:
    # True == 1 and "16" != 16 in Python; only values of the same kind match here.
    return kind_of(value) == kind_of(literal) and value == literal


def _builds_object(value: Any) -> bool:
    return isinstance(value, (DictConfig, dict)) and "_target_" in value


def _resolved(container: Any, key: Any) -> Any:
    """``container[key]`` resolved, or ``_UNRESOLVED`` when it is missing or cannot be yet."""
    if not isinstance(container, (DictConfig, ListConfig)):
        return container[key]
    try:
        if OmegaConf.is_missing(container, key):
            return _UNRESOLVED
        return container[key]
    except (InterpolationResolutionError, MissingMandatoryValue):
        return _UNRESOLVED
