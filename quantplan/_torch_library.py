"""The conventions of quantplan's ``torch.library`` operators, apart from the operators themselves:
the ``quantplan`` namespace (:data:`LIBRARY`) and :func:`define`, a scope as ``int[] scope`` =
``[kind, axis, group_size]`` (:func:`scope_ints`, :func:`scope_of`), an element kind as its enum
index (:func:`kind_index`), a Philox seed or offset in [2**63, 2**64) as its two's complement
(:func:`signed_seed`, :func:`unsigned_seed`). :mod:`quantplan._torch_ops` (the functional and
collective operators) and :mod:`quantplan.pytorch` (the fake-quantize operators) both define theirs
with these, so neither front-end imports the other's operators."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from quantplan.vocabulary.errors import InvalidProblem
from quantplan.vocabulary.types import ChannelScope, ElementKind, GroupScope, Scope, TensorScope, TokenScope

#: The ``quantplan`` operator namespace (every front-end defines its operators in it).
LIBRARY = torch.library.Library("quantplan", "FRAGMENT")

_KINDS = tuple(ElementKind)
_KIND_INDEX = {kind: i for i, kind in enumerate(_KINDS)}


def define(schema: str, impl: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """Define ``quantplan::<schema>`` with ``impl`` as its CPU and CUDA kernel and ``fake`` as its
    fake implementation; returns the operator's default overload (what the front-ends call)."""
    name = schema.partition("(")[0]
    LIBRARY.define(schema)
    LIBRARY.impl(name, impl, "CPU")
    LIBRARY.impl(name, impl, "CUDA")
    torch.library.register_fake(f"quantplan::{name}", fake, lib=LIBRARY)
    return getattr(torch.ops.quantplan, name).default


def scope_ints(scope: Any) -> list[int]:
    """``scope`` as the operators take it: ``[kind, axis, group_size]`` (kind: 0 TensorScope,
    1 ChannelScope, 2 TokenScope, 3 GroupScope). Type tests and field reads only, so torch.compile
    traces it (no pydantic call)."""
    kind = type(scope)
    if kind is TensorScope:
        return [0, 0, 0]
    if kind is ChannelScope:
        return [1, scope.axis, 0]
    if kind is TokenScope:
        return [2, 0, 0]
    if kind is GroupScope:
        return [3, scope.axis, scope.group_size]
    raise InvalidProblem(
        f"scope={scope!r} must be TensorScope(), ChannelScope(axis), TokenScope() or GroupScope(axis, group_size)"
    )


_SCOPE_OF: dict[tuple[int, ...], Scope] = {(0, 0, 0): TensorScope()}


def scope_of(ints: Sequence[int]) -> Scope:
    """The scope that :func:`scope_ints` wrote as ``ints`` (one object per value, cached)."""
    key = tuple(ints)
    found = _SCOPE_OF.get(key)
    if found is not None:
        return found
    if len(key) != 3 or not 0 <= key[0] <= 3:
        raise InvalidProblem(f"scope={list(ints)!r} must be [kind 0-3, axis, group_size]")
    kind, axis, group_size = key
    scope: Scope
    if kind == 0:
        scope = TensorScope()
    elif kind == 1:
        scope = ChannelScope(axis=axis)
    elif kind == 2:
        scope = TokenScope()
    else:
        scope = GroupScope(axis=axis, group_size=group_size)
    _SCOPE_OF[key] = scope
    return scope


def signed_seed(value: Any) -> Any:
    """A Philox seed / offset for an ``int`` operator argument: an int in [2**63, 2**64) as its
    two's complement; anything else (smaller ints, None, tensors) as it is."""
    return value - 2**64 if type(value) is int and value >= 2**63 else value


def unsigned_seed(value: Any) -> Any:
    """The inverse of :func:`signed_seed`."""
    return value + 2**64 if type(value) is int and value < 0 else value


def fresh_like(x: Any) -> Any:
    """A new C-contiguous tensor of ``x``'s shape, dtype and device."""
    return x.new_empty(x.shape)


def kind_index(kind: ElementKind) -> int:
    """``kind`` as an operator's ``int`` argument."""
    return _KIND_INDEX[kind]


__all__ = [
    "LIBRARY",
    "define",
    "fresh_like",
    "kind_index",
    "scope_ints",
    "scope_of",
    "signed_seed",
    "unsigned_seed",
]
