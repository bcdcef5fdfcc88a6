"""The qgZ / qwZ computations on one device: argument checks, staging buffers, and the swizzled
quantization and dequantize-reduce steps (the plans, or their composition from the plain plans)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from quantplan._frontend import Target
from quantplan._torch_ops import (
    dequant_reduce_out_op,
    dequantize_out_op,
    dynamic_quantize_out_op,
    kind_index,
    scope_ints,
    swizzled_quantize_out_op,
)
from quantplan.ops.dequant_reduce import DequantReduceDescriptor, DequantReducePlan
from quantplan.ops.dynamic_range import DynamicRangeQuantizeDescriptor, DynamicRangeQuantizePlan
from quantplan.ops.static_quantize import DequantizeDescriptor, DequantizePlan
from quantplan.ops.swizzled_quantize import SwizzledQuantizeDescriptor, SwizzledQuantizePlan
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import InvalidProblem, Unsupported
from quantplan.vocabulary.types import ElementKind, GroupScope, QuantMode

Implementation = Literal["auto", "plans", "composed"]

_FLOATS: dict[torch.dtype, ElementKind] = {
    torch.float16: ElementKind.F16,
    torch.bfloat16: ElementKind.BF16,
    torch.float32: ElementKind.F32,
}
_CODES = (ElementKind.S8, ElementKind.U8, ElementKind.S4, ElementKind.U4)


# ---- small helpers ------------------------------------------------------------------------------


def _storage(elements: int, code: ElementKind) -> int:
    """Bytes (elements of the storage dtype) holding ``elements`` codes of ``code``."""
    return elements // 2 if ELEMENTS[code].is_packed else elements


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidProblem(f"{name}={value!r} must be an integer >= 1")
    return int(value)


def _float_kind(dtype: Any, name: str) -> ElementKind:
    kind = _FLOATS.get(dtype)
    if kind is None:
        raise InvalidProblem(
            f"{name} has dtype {dtype}; quantized collectives take float16, bfloat16 or float32 tensors "
            f"(cast with .float() or .bfloat16())"
        )
    return kind


def _code_kind(code: Any) -> ElementKind:
    if not isinstance(code, ElementKind) or code not in _CODES:
        name = code.name if isinstance(code, ElementKind) else repr(code)
        raise InvalidProblem(f"code={name}: quantized collectives send integer codes: S8, U8, S4 or U4")
    return code


def _mode(mode: Any, code: ElementKind) -> QuantMode:
    if not isinstance(mode, QuantMode):
        raise InvalidProblem(f"mode={mode!r} must be QuantMode.SYMMETRIC or QuantMode.ASYMMETRIC")
    if mode is QuantMode.SYMMETRIC and code in (ElementKind.U8, ElementKind.U4):
        raise InvalidProblem(
            f"code={code.name} with SYMMETRIC mode would clip every negative value to 0 (zero point 0, codes >= 0); "
            f"use S8 / S4 for SYMMETRIC, or ASYMMETRIC for unsigned codes"
        )
    return mode


def _device(device: Any) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cuda", "cpu"):
        raise InvalidProblem(
            f"tensors live on a {dev.type!r} device; quantized collectives run CUDA tensors (NCCL) and CPU "
            f"tensors (gloo, reference backend)"
        )
    return dev


def _check_pair(output: Any, input: Any) -> tuple[ElementKind, torch.device]:
    """Checks of one call that need no problem: types, residence, dtype agreement, contiguity."""
    for name, t in (("input", input), ("output", output)):
        if not isinstance(t, torch.Tensor):
            raise InvalidProblem(f"{name} is a {type(t).__name__}; pass a torch.Tensor")
    if input.device != output.device:
        raise InvalidProblem(
            f"input lives on {input.device} and output on {output.device}; both must be on the same device"
        )
    kind = _float_kind(input.dtype, "input")
    if output.dtype != input.dtype:
        raise InvalidProblem(f"output has dtype {output.dtype} but input {input.dtype}; they must match")
    for name, t in (("input", input), ("output", output)):
        if not t.is_contiguous():
            raise InvalidProblem(f"{name} is not contiguous; pass {name}.contiguous()")
    return kind, _device(input.device)


@dataclass(frozen=True)
class _Buffers:
    """Codes, float32 scales and (ASYMMETRIC) int32 zero points of ``rows`` blocks of ``elements``."""

    q: torch.Tensor
    s: torch.Tensor
    z: torch.Tensor | None

    @classmethod
    def empty(
        cls, target: Target, rows: int, elements: int, group_size: int, code: ElementKind, mode: QuantMode
    ) -> _Buffers:
        groups = elements // group_size
        z = target.empty((rows, groups), "int32") if mode is QuantMode.ASYMMETRIC else None
        codes = target.empty((rows, _storage(elements, code)), "int8" if code is ElementKind.S8 else "uint8")
        return cls(codes, target.empty((rows, groups), "float32"), z)

    def tensors(self) -> list[torch.Tensor]:
        return [self.q, self.s] if self.z is None else [self.q, self.s, self.z]

    def row_bytes(self) -> int:
        """Bytes of one row block (codes and parameters)."""
        return sum(t[0].numel() * t.element_size() for t in self.tensors())

    def flat(self) -> _Buffers:
        return _Buffers(self.q.view(-1), self.s.view(-1), None if self.z is None else self.z.view(-1))


# ---- the qgZ steps: swizzled quantization and dequantize-reduce ----------------------------------


class _Step:
    """One computation of a collective on one device; ``label`` says which implementation runs it."""

    label: str


class _SwizzleStep(_Step):
    """Swizzled quantization of the flat input into the send buffers ``(devices_per_node, nodes * slice)``."""

    def run(self, x: torch.Tensor, send: _Buffers) -> None:
        raise NotImplementedError


class _ReduceStep(_Step):
    """Dequantize-reduce of ``(peers, chunk)`` received blocks into re-quantized buffers or the float output."""

    def run(self, src: _Buffers, out: _Buffers | torch.Tensor) -> None:
        raise NotImplementedError


StepT = TypeVar("StepT", bound=_Step)


def _auto(
    implementation: Implementation, target: Target, plans: Callable[[], StepT], composed: Callable[[], StepT]
) -> StepT:
    """The step ``implementation`` asks for; "auto": the plan, or on CUDA the composition where the
    plan has no CUDA kernel (its ``select`` raises Unsupported)."""
    if implementation == "composed":
        return composed()
    if implementation == "plans" or not target.cuda:
        return plans()
    try:
        return plans()
    except Unsupported:
        return composed()


def plan_label(plan: Any) -> str:
    """``Plan[backend:variant]``, how ``describe()`` names a plan."""
    sku = plan.sku()
    return f"{type(plan).__name__}[{sku.backend.value}:{sku.variant}]"


class _PlanStep(_Step):
    """A step that is one plan, selected on ``target`` for ``desc``."""

    def __init__(self, target: Target, plan_cls: Any, desc: Any) -> None:
        self.target = target
        self.plan = target.select(plan_cls, desc)
        self.label = plan_label(self.plan)


class _SwizzlePlanStep(_PlanStep, _SwizzleStep):
    """SwizzledQuantizePlan writing the send buffers ``(devices_per_node, nodes * slice)``."""

    def __init__(self, target: Target, desc: SwizzledQuantizeDescriptor) -> None:
        super().__init__(target, SwizzledQuantizePlan, desc)
        self.desc = desc

    def run(self, x: torch.Tensor, send: _Buffers) -> None:
        d = self.desc
        swizzled_quantize_out_op(
            x,
            send.q,
            send.s,
            send.z,
            d.group_size,
            d.nodes,
            d.devices_per_node,
            kind_index(d.output_element),
            d.mode is QuantMode.ASYMMETRIC,
        )


def _flat_groups_plan(
    target: Target,
    plan_cls: type[DynamicRangeQuantizePlan] | type[DequantizePlan],
    numel: int,
    group_size: int,
    mode: QuantMode,
    input_element: ElementKind,
    output_element: ElementKind,
) -> tuple[Any, list[int]]:
    """``plan_cls`` (DynamicRangeQuantizePlan or DequantizePlan) over groups of ``group_size`` of a
    flat ``(numel,)`` array, and the group scope as the operators take it."""
    desc_cls = DynamicRangeQuantizeDescriptor if plan_cls is DynamicRangeQuantizePlan else DequantizeDescriptor
    desc = desc_cls(
        shape=(numel,),
        scope=GroupScope(axis=-1, group_size=group_size),
        mode=mode,
        input_element=input_element,
        output_element=output_element,
    )
    return target.select(plan_cls, desc), scope_ints(desc.scope)


class _SwizzleComposed(_SwizzleStep):
    """DynamicRangeQuantizePlan over groups of the flat input, then the (node, device) -> (device,
    node) transpose of whole slices (none for one node): the SwizzledQuantizePlan result, bit for bit."""

    def __init__(self, target: Target, desc: SwizzledQuantizeDescriptor) -> None:
        self.target = target
        self.nodes = desc.nodes
        self.dpn = desc.devices_per_node
        self.plan, self.scope = _flat_groups_plan(
            target, DynamicRangeQuantizePlan, desc.numel, desc.group_size, desc.mode, desc.input_element,
            desc.output_element,
        )  # fmt: skip
        self.code = kind_index(desc.output_element)
        self.asymmetric = desc.mode is QuantMode.ASYMMETRIC
        self.tmp = (
            _Buffers.empty(target, 1, desc.numel, desc.group_size, desc.output_element, desc.mode).flat()
            if desc.nodes > 1
            else None
        )
        self.label = f"composed[DynamicRangeQuantizePlan:{self.plan.sku().variant}+swizzle copy]"

    def run(self, x: torch.Tensor, send: _Buffers) -> None:
        out = send.flat() if self.tmp is None else self.tmp
        dynamic_quantize_out_op(x, out.q, out.s, out.z, self.code, self.scope, self.asymmetric)
        if self.tmp is not None:
            for src, dst in zip(self.tmp.tensors(), send.tensors(), strict=True):
                dst.view(self.dpn, self.nodes, -1).copy_(src.view(self.nodes, self.dpn, -1).transpose(0, 1))


class _ReducePlanStep(_PlanStep, _ReduceStep):
    """DequantReducePlan: ``(peers, chunk)`` codes in, a re-quantized chunk or the float result out."""

    def __init__(self, target: Target, desc: DequantReduceDescriptor) -> None:
        super().__init__(target, DequantReducePlan, desc)
        self.desc = desc

    def run(self, src: _Buffers, out: _Buffers | torch.Tensor) -> None:
        d = self.desc
        if isinstance(out, torch.Tensor):
            y, s_out, z_out = out, None, None
        else:
            flat = out.flat()
            y, s_out, z_out = flat.q, flat.s, flat.z
        dequant_reduce_out_op(
            src.q,
            src.s,
            src.z,
            y,
            s_out,
            z_out,
            d.peers,
            d.chunk_elements,
            d.input_group_size,
            d.output_group_size,
            kind_index(d.input_element),
            kind_index(d.output_element),
            d.average,
        )


class _ReduceComposed(_ReduceStep):
    """DequantizePlan of all peers' chunks to float32, float32 additions in peer order, an IEEE
    division by ``float32(peers)`` (a device tensor: true division, not a product with 1 / N), then
    DynamicRangeQuantizePlan (code output) or one rounding to the float output: the DequantReducePlan
    result, bit for bit."""

    def __init__(self, target: Target, desc: DequantReduceDescriptor) -> None:
        self.target = target
        self.peers = desc.peers
        self.average = desc.average and desc.peers > 1
        chunk = desc.chunk_elements
        self.dequantize, self.in_scope = _flat_groups_plan(
            target, DequantizePlan, desc.peers * chunk, desc.input_group_size, desc.mode, desc.input_element,
            ElementKind.F32,
        )  # fmt: skip
        self.in_code = kind_index(desc.input_element)
        self.asymmetric = desc.mode is QuantMode.ASYMMETRIC
        self.y = target.empty((desc.peers, chunk), "float32")
        self.acc = target.empty((chunk,), "float32") if desc.peers > 1 else self.y[0]
        self.divisor = torch.full((), float(desc.peers), dtype=torch.float32, device=target.device)
        self.quantize: Any = None
        variant = f"DequantizePlan:{self.dequantize.sku().variant}"
        if not ELEMENTS[desc.output_element].is_float:
            assert desc.output_group_size is not None
            self.quantize, self.out_scope = _flat_groups_plan(
                target, DynamicRangeQuantizePlan, chunk, desc.output_group_size, desc.mode, ElementKind.F32,
                desc.output_element,
            )  # fmt: skip
            self.out_code = kind_index(desc.output_element)
            variant += f"+DynamicRangeQuantizePlan:{self.quantize.sku().variant}"
        self.label = f"composed[{variant}]"

    def run(self, src: _Buffers, out: _Buffers | torch.Tensor) -> None:
        flat = src.flat()
        dequantize_out_op(flat.q, flat.s, flat.z, self.y.view(-1), self.in_code, self.in_scope, 0)
        acc = self.acc
        if self.peers > 1:
            torch.add(self.y[0], self.y[1], out=acc)
            for j in range(2, self.peers):
                acc.add_(self.y[j])
            if self.average:
                acc.div_(self.divisor)
        if isinstance(out, torch.Tensor):
            out.copy_(acc)
            return
        o = out.flat()
        dynamic_quantize_out_op(acc, o.q, o.s, o.z, self.out_code, self.out_scope, self.asymmetric)
