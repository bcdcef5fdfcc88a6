"""Plans in DeepSpeed's formats: what :mod:`quantplan.compat.deepspeed` builds and runs.

Each plan follows quantplan's plan API (``select`` validates, ``can_implement`` checks operands,
``workspace_size`` / ``precision_guarantee`` / ``sku``, ``run``) on flat operands. Their
numerics are DeepSpeed's (:mod:`quantplan.reference.deepspeed_format`), not SPEC section 4's,
which is why they are separate from :class:`~quantplan.SwizzledQuantizePlan` and
:class:`~quantplan.DequantReducePlan`. Symmetric dequantization needs no plan of its own: its
formula ``x = q * (1/scale)`` is :class:`~quantplan.DequantizePlan`'s with ``scale = 1/scale``
stored and ``zp = 0``, and :mod:`quantplan.compat.deepspeed` runs it there.

**Kernel variants:** ``kernels/deepspeed_format.cu`` (device code
``kernels/qp_deepspeed_format.cuh``) on the qgZ loops of ``kernels/qp_qgz.cuh``: the fused single
pass for groups of at most 32768 elements (4-bit: even groups), otherwise two passes (group
parameters, then elements) with a workspace of 8 bytes per group; for aligned F16 / BF16 groups
of ``team * 8 * nv`` without LoCo, the dense passes (``deepspeed_quantize_dense``,
``moq_fake_quantize_dense``, and ``deepspeed_reduce_dense`` over output groups of ``team * 8``)
and, for few long groups on sm_90, a thread-block cluster per group (``*_cluster``), all in
``kernels/qp_deepspeed_format.cuh``; ``numpy-deepspeed-format`` on the reference backend. Tests: ``tests/test_compat_deepspeed.py`` (formulas, layouts),
``tests/test_compat_deepspeed_gpu.py`` (kernels equal the reference bit for bit).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import ConfigDict

from quantplan.reference import deepspeed_format as dsref
from quantplan.runtime import _qgz_launch
from quantplan.runtime._device import DeviceInfo, device_info, stream_device_id
from quantplan.runtime._kernel_names import (
    QGZ_WIDTHS,
    deepspeed_cluster_name,
    deepspeed_code_kind,
    deepspeed_dense_name,
    deepspeed_dequantize_unit,
    deepspeed_lanes_name,
    deepspeed_quantize_unit,
    deepspeed_reduce_dense_name,
    deepspeed_reduce_unit,
    error_tag,
    moq_cluster_name,
    moq_dense_name,
    moq_fake_quantize_unit,
)
from quantplan.runtime._launch import PreparedLaunch, fields, launch_on, params_struct, vector_alignment
from quantplan.runtime._operands import (
    Operand,
    check_disjoint,
    check_positive,
    host_view,
    reference_uniform,
    same_or_disjoint,
    write_back,
)
from quantplan.runtime._plan import Plan, choose_backend, snapshot
from quantplan.runtime._qgz_launch import QgzOperands, beta_pair
from quantplan.runtime._segments import SegmentGeometry, SegmentLayoutArgs, segment_layout
from quantplan.runtime._selection import DS_CLUSTER_BLOCKS as CLUSTER_BLOCKS
from quantplan.runtime._selection import (
    DS_DENSE_BLOCK,
    SCHEDULES,
    GroupChoice,
    GroupProblem,
    choose_groups,
    choose_reduce,
)
from quantplan.runtime._tuning import kernel_options
from quantplan.runtime.compiler import load_kernels, template_name
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary import types
from quantplan.vocabulary.elements import ELEMENTS, ElementInfo
from quantplan.vocabulary.errors import InvalidProblem
from quantplan.vocabulary.types import ElementKind, Model, QuantMode, Rounding

_FROZEN = ConfigDict(frozen=True, extra="forbid")
#: DeepSpeed's code storage: int8 tensors (4-bit: two signed nibbles per byte); uint8 views accepted.
_DS_CODES = ElementInfo(
    ElementKind.S8,
    "qp::s8",
    8,
    np.dtype(np.int8),
    frozenset({"int8", "uint8"}),
    is_integer_code=True,
    code_range=(-128, 127),
)
_F32 = ELEMENTS[ElementKind.F32]
#: Derived sizes of the DeepSpeed-format descriptors (properties), snapshotted at select.
_DERIVED = ("output_bytes", "input_bytes", "param_shape", "input_param_shape", "chunk_elements", "stochastic")
_VARIANT = "numpy-deepspeed-format"
_FAMILY = "deepspeed_format"
#: Bytes of the two-pass workspace per group: (multiplier | scale | step, offset | min), float32.
WORKSPACE_BYTES_PER_GROUP = 8


class DeepSpeedOutputArgs(ctypes.Structure):
    """``struct DeepSpeedOutputArgs`` of ``kernels/qp_deepspeed_format.cuh``."""

    _fields_ = [
        *fields(ctypes.c_uint64, "q", "params", "work", "error"),
        *fields(ctypes.c_float, "beta", "one_minus_beta"),
        *fields(ctypes.c_uint64, "seed", "offset"),
        *fields(ctypes.c_int32, "bits", "asym"),
    ]


_QUANTIZE_PARAMS = params_struct(
    "DeepSpeedQuantizeParams",
    [
        ("x", ctypes.c_uint64),
        ("out", DeepSpeedOutputArgs),
        ("layout", SegmentLayoutArgs),
        ("map", _qgz_launch.SwizzleMapArgs),
    ],
)
_REDUCE_PARAMS = params_struct(
    "DeepSpeedReduceParams",
    [("input", _qgz_launch.PeerSumArgs), ("out", DeepSpeedOutputArgs), ("layout", SegmentLayoutArgs)],
)
_DEQUANTIZE_PARAMS = params_struct(
    "DeepSpeedDequantizeParams", [("input", _qgz_launch.PeerSumArgs), ("y", ctypes.c_uint64), ("n", ctypes.c_int64)]
)
_MOQ_PARAMS = params_struct(
    "MoQFakeQuantizeParams", [("x", ctypes.c_uint64), ("out", DeepSpeedOutputArgs), ("layout", SegmentLayoutArgs)]
)


def _backend(
    stream: Any, pref: types.PlanPreference | None, op: str | None = None
) -> tuple[types.BackendKind, int | None]:
    """The backend and device of a plan of ``op`` (its forced schedule's name is checked here;
    None: a plan of one schedule)."""
    backend = choose_backend(pref, stream, SCHEDULES[op] if op else ())
    return backend, (None if backend is types.BackendKind.REFERENCE else stream_device_id(stream))


def _forced(pref: types.PlanPreference | None) -> str | None:
    return None if pref is None else pref.schedule


def _check_groups(numel: int, groups: int) -> None:
    if isinstance(numel, bool) or numel < 0:
        raise InvalidProblem(f"numel={numel!r} must be >= 0")
    check_positive("groups", groups)
    if numel % groups:
        raise InvalidProblem(
            f"{numel} elements do not split into {groups} equal groups; pick a groups count that divides the "
            f"element count (any group size works, it need not be a multiple of 8)"
        )


def _check_bits(bits: int, allowed: tuple[int, ...]) -> None:
    if bits not in allowed:
        raise InvalidProblem(f"num_bits={bits!r}: this function takes {' or '.join(map(str, allowed))} bits")


def _storage_bytes(elements: int, bits: int) -> int:
    return elements * bits // 8


class _GroupedCodes:
    """What a descriptor of ``numel`` flat codes of ``num_bits`` in ``groups`` groups derives (the
    quantize and dequantize descriptors)."""

    if TYPE_CHECKING:
        numel: int
        groups: int
        num_bits: int
        mode: QuantMode

    @property
    def code_bytes(self) -> int:
        """Bytes of the flat codes: ``numel * num_bits / 8``."""
        return _storage_bytes(self.numel, self.num_bits)

    @property
    def param_shape(self) -> tuple[int, int]:
        """``(groups, 1)`` (SYMMETRIC) or ``(groups, 2)`` (ASYMMETRIC)."""
        return (self.groups, dsref.params_per_group(self.mode))


class _DeepSpeedPlan(_qgz_launch.QgzChecks, Plan[Any, QgzOperands]):
    """What the DeepSpeed-format plans share: identity, flat code operands, the per-call writes of
    the qgZ launches (:meth:`_fields`) and the two-pass workspace (``out.work``)."""

    _op = types.QuantizeKind.DYNAMIC_RANGE
    _extract_fields = ("input", "params", "zero_point", "output", "params_out", "zero_point_out", "error_feedback")
    #: The launches' argument block has a ``DeepSpeedOutputArgs`` field ``out``.
    _has_out: ClassVar[bool] = True

    def __init__(
        self,
        desc: Any,
        backend: types.BackendKind,
        element: ElementKind,
        aux_element: ElementKind,
        numel: int,
        device_id: int | None = None,
        launches: _qgz_launch.QgzLaunches | None = None,
        groups: int = 0,
    ) -> None:
        two_pass = launches is not None and launches.fused is None and bool(launches.two_pass)
        super().__init__(
            desc,
            device_id,
            element,
            aux_element,
            _VARIANT if launches is None else f"deepspeed-format:{launches.describe}",
            workspace_bytes=groups * WORKSPACE_BYTES_PER_GROUP if two_pass else 0,
            prepared=() if launches is None else launches.launches,
            empty=numel == 0 or launches is None,
            backend=backend,
        )
        self.descriptor = desc
        #: The descriptor's fields and sizes as plain attributes (read by the checks of every run).
        self._d = snapshot(desc, *(n for n in _DERIVED if hasattr(desc, n)))
        self._launches = launches
        self._numel = numel

    def _codes(self, value: Any, name: str, nbytes: int) -> Operand:
        """A flat code operand of ``nbytes`` bytes: int8 (DeepSpeed's dtype) or uint8."""
        if value is None:
            raise InvalidProblem(f"{name} is required: a flat int8 array of {nbytes} bytes")
        return self._tensor(value, name, (nbytes,), _DS_CODES)

    def _pointers(self, a: QgzOperands) -> tuple[int, ...]:
        """The pointers the fused pass moves in vectors, in the order of its alignments."""
        return (a.x.ptr, a.y.ptr) if a.err is None else (a.x.ptr, a.y.ptr, a.err.ptr)

    def _fields(self, params: Any, a: QgzOperands) -> None:
        """Write the per-call fields of one launch's argument block."""
        raise NotImplementedError

    def _launch(self, handle: int, workspace: Workspace | None, a: QgzOperands) -> None:
        assert self._launches is not None and self.device_id is not None
        launches = self._launches.chosen(self._pointers(a))
        work = 0 if workspace is None or not self._workspace_bytes else workspace.ptr
        for launch in launches:
            params = launch.params
            self._fields(params, a)
            if self._has_out:
                params.out.work = work
        launch_on(self.device_id, handle, *launches)

    def _run_reference(self, a: QgzOperands) -> None:
        if self._numel:
            self._reference(a)

    def _reference(self, a: QgzOperands) -> None:
        raise NotImplementedError


def _output_args(out: Any, a: QgzOperands, bits: int, mode: QuantMode) -> None:
    """The per-call fields of ``DeepSpeedOutputArgs`` (``work``: see ``_DeepSpeedPlan._launch``)."""
    out.q = a.y.ptr
    out.params = 0 if a.params_out is None else a.params_out.ptr
    out.error = 0 if a.err is None else a.err.ptr
    out.beta = a.beta
    out.one_minus_beta = a.one_minus_beta
    out.bits = bits
    out.asym = int(mode is QuantMode.ASYMMETRIC)


def _input_args(peers: Any, a: QgzOperands, mode: QuantMode) -> None:
    """The per-call fields of the peers' ``PeerSumArgs``: codes and parameter rows (``zp``
    non-null: ASYMMETRIC rows, DeepSpeedPeerDecode)."""
    assert a.params is not None
    peers.q = a.x.ptr
    peers.scale = a.params.ptr
    peers.zp = a.params.ptr if mode is QuantMode.ASYMMETRIC else 0


def _bytes(op: Operand) -> np.ndarray:
    return np.asarray(op.obj).view(np.uint8)


@dataclass(frozen=True)
class _Dense:
    """A dense or cluster pass (``kernels/qp_deepspeed_format.cuh``) and its launch shape."""

    launch: _qgz_launch.DenseLaunch
    block: int
    grid: int
    cluster: bool = False


def _dense_pass(
    choice: GroupChoice,
    groups: int,
    dense_name: Callable[[int], str],
    cluster_name: str,
    functions: dict[str, Any],
    lanes_name: Callable[[int], str] | None = None,
) -> _Dense | None:
    """The pass of the schedule ``choice`` (:func:`quantplan.runtime._selection.choose_groups`) replacing
    the fused one for ``groups`` aligned groups, or None (``fused``, ``fused-element-io``,
    ``two-pass``).

    * cluster: ``CLUSTER_BLOCKS`` blocks of ``choice.team`` threads per group, one vector per thread;
    * lanes: ``lanes_name(team)``, the dense geometry with one vector per thread, the team's size
      a compile-time constant (``deepspeed_quantize_lanes``: groups of 128);
    * dense: ``dense_name(nv)``, teams of ``choice.team``, blocks of ``DS_DENSE_BLOCK`` threads.

    The grid covers every group at once (not a grid of resident blocks striding over the groups)."""
    team, nv = choice.team, choice.nv
    if choice.schedule == "cluster":
        tag = f"cluster[{CLUSTER_BLOCKS}x{team}t-per-group,1vec8-per-thread]"
        return _Dense(
            _qgz_launch.DenseLaunch(functions[cluster_name], team, 8, tag), team, groups * CLUSTER_BLOCKS, cluster=True
        )
    if choice.schedule == "lanes":
        assert lanes_name is not None
        launch = _qgz_launch.DenseLaunch(
            functions[lanes_name(team)], team, 8, f"lanes[{team}t-per-group,1vec8-per-thread]"
        )
        return _Dense(launch, DS_DENSE_BLOCK, -(-groups // (DS_DENSE_BLOCK // team)))
    if choice.schedule == "dense":
        launch = _qgz_launch.DenseLaunch(
            functions[dense_name(nv)], team, 8, f"dense[{team}t-per-group,{nv}vec8-per-thread]"
        )
        return _Dense(launch, DS_DENSE_BLOCK, -(-groups // (DS_DENSE_BLOCK // team)))
    return None


def _with_dense(
    launches: _qgz_launch.QgzLaunches,
    dense: _Dense | None,
    kernels: _qgz_launch.QgzKernels,
    layout: SegmentLayoutArgs | None,
    bits: list[int],
) -> _qgz_launch.QgzLaunches:
    """``launches`` with the dense or cluster launch at its own block and grid. A dense pass came
    from ``prepare_qgz_launches(dense=dense.launch)``; a cluster pass (the fused pass and its
    element-I/O twin came from ``prepare_qgz_launches``) is prepared here, without an occupancy
    query (its grid is fixed: ``CLUSTER_BLOCKS`` blocks per group). ``layout``: the kernels'
    ``SegmentLayout`` (cluster passes); ``bits``: the element bits of the operands in vectors
    (their alignments)."""
    if dense is None:
        return launches
    if dense.cluster:
        assert layout is not None
        launch = PreparedLaunch(
            dense.launch.function, dense.grid, dense.block, kernels.params_type, layout=layout, **kernels.fixed
        )
        aligns = tuple(vector_alignment(dense.launch.vec, b) for b in bits)
        return _qgz_launch.QgzLaunches(launch, launches.fused_fallback, (), aligns, dense.launch.describe)
    assert launches.fused is not None
    launches.fused.block, launches.fused.grid = dense.block, dense.grid
    return launches


def _group_launches(
    kernels: _qgz_launch.QgzKernels,
    schedule: str,
    dense: _Dense | None,
    groups: int,
    group_size: int,
    packed: bool,
    q_min: int,
    q_max: int,
    mode: QuantMode,
    bits: list[int],
    info: DeviceInfo,
) -> _qgz_launch.QgzLaunches:
    """The launches of a plan that quantizes its own ``groups`` groups of ``group_size`` elements
    (quantize, MoQ): the fused pass or two passes over the groups (``packed``: 4-bit codes, two
    per work item of the element pass), or ``dense`` (:func:`_dense_pass`) in its place;
    ``schedule``: the chosen schedule (``fused-element-io``: the element-I/O twin for every
    operand; ``two-pass``: no fused pass)."""
    launches = _qgz_launch.prepare_qgz_launches(
        kernels,
        _fused_geometry(schedule, groups, group_size, packed, QGZ_WIDTHS[0], info),
        groups,
        group_size,
        groups * group_size // (2 if packed else 1),
        q_min,
        q_max,
        mode,
        bits,
        info,
        own_range=True,
        dense=None if dense is None or dense.cluster else dense.launch,
    )
    team = 1 if dense is None else dense.launch.team
    layout = segment_layout(groups, group_size, team, q_min, q_max, mode, own_range=True)
    return _with_dense(launches, dense, kernels, layout, bits)


def _fused_geometry(
    schedule: str, groups: int, group_size: int, packed: bool, vec_max: int, info: DeviceInfo
) -> tuple[SegmentGeometry, SegmentGeometry] | None:
    """The fused pass's geometry pair of ``schedule``: None for ``two-pass``, the element-I/O
    twin twice for ``fused-element-io``."""
    if schedule == "two-pass":
        return None
    geometry = _qgz_launch.qgz_geometry(groups, group_size, packed, vec_max, info)
    assert geometry is not None
    return (geometry[1], geometry[1]) if schedule == "fused-element-io" else geometry


# ---- quantize / swizzle_quant / loco_swizzle_quant ---------------------------------------------


class DeepSpeedQuantizeDescriptor(_GroupedCodes, Model):
    """DeepSpeed-format group quantization, optionally swizzled and with LoCo error feedback.

    Fields: ``numel`` elements in ``groups`` equal contiguous groups; ``num_bits`` 8 or 4;
    ``mode``; ``input_element`` F16 / BF16 / F32; ``nodes``, ``devices_per_node``, ``pipeline``
    (swizzle; 1, 1, 1 = plain ``quantize``); ``error_element`` None or the LoCo buffer's element.
    """

    model_config = _FROZEN
    numel: int
    groups: int
    num_bits: int
    mode: QuantMode = QuantMode.SYMMETRIC
    input_element: ElementKind
    nodes: int = 1
    devices_per_node: int = 1
    pipeline: int = 1
    error_element: ElementKind | None = None

    @property
    def output_bytes(self) -> int:
        """Bytes of the flat code output: ``numel * num_bits / 8``."""
        return self.code_bytes


@dataclass(slots=True)
class DeepSpeedQuantizeArgs:
    """``input`` (flat, ``numel``), ``output`` (flat int8 / uint8, ``output_bytes``), ``params_out``
    (float32 ``param_shape``); LoCo: ``error_feedback`` (flat, ``numel``, updated in place) and
    ``error_beta``."""

    input: Any
    output: Any
    params_out: Any
    error_feedback: Any = None
    error_beta: Any = None


def _quantize_groups(desc: DeepSpeedQuantizeDescriptor) -> GroupProblem:
    """What the group schedules read of ``desc`` (the lanes pass has no group map: only where the
    map is the identity, ds_map32)."""
    identity = desc.pipeline == 1 and (desc.nodes == 1 or desc.devices_per_node == 1)
    packed = ELEMENTS[deepspeed_code_kind(desc.num_bits)].is_packed
    group_size = desc.numel // desc.groups
    return GroupProblem(desc.groups, group_size, desc.input_element, packed, desc.error_element is None, identity)


def _prepare_quantize(desc: DeepSpeedQuantizeDescriptor, device_id: int, forced: str | None) -> _qgz_launch.QgzLaunches:
    """Compile (first use) and prepare the launches of ``desc`` on ``device_id`` (``forced``: the
    schedule ``PlanPreference`` forces)."""
    info = device_info(device_id)
    code = ELEMENTS[deepspeed_code_kind(desc.num_bits)]
    unit = deepspeed_quantize_unit(desc.input_element, desc.error_element, desc.num_bits)
    functions = load_kernels(_FAMILY, unit, info.arch, device_id, kernel_options())
    tags = (ELEMENTS[desc.input_element].cpp_tag, error_tag(desc.error_element), code.cpp_tag)
    slices = desc.nodes * desc.devices_per_node * desc.pipeline
    group_size = desc.numel // desc.groups
    kernels = _qgz_launch.QgzKernels(
        lambda vec, vector_io: functions[template_name("deepspeed_quantize_segments", *tags, vec, vector_io)],
        functions[template_name("deepspeed_quantize_group_params", tags[0], tags[1])],
        functions[template_name("deepspeed_quantize_elements", *tags)],
        _QUANTIZE_PARAMS,
        dict(
            map=_qgz_launch.SwizzleMapArgs(desc.groups // slices, desc.nodes, desc.devices_per_node, desc.pipeline, 0)
        ),
    )
    bits = [ELEMENTS[desc.input_element].storage_bits, code.storage_bits]
    if desc.error_element is not None:
        bits.append(ELEMENTS[desc.error_element].storage_bits)
    q_min, q_max = dsref.code_bounds(desc.num_bits)
    # Aligned 16-bit groups without LoCo: the dense, lanes or cluster pass (kernels/qp_deepspeed_format.cuh).
    asym = desc.mode is QuantMode.ASYMMETRIC
    choice = choose_groups("deepspeed_quantize", _quantize_groups(desc), info, forced)
    dense = _dense_pass(
        choice,
        desc.groups,
        lambda nv: deepspeed_dense_name(desc.input_element, desc.num_bits, asym, nv),
        deepspeed_cluster_name(desc.input_element, desc.num_bits, asym),
        functions,
        lambda team: deepspeed_lanes_name(desc.input_element, desc.num_bits, asym, team),
    )
    return _group_launches(
        kernels, choice.schedule, dense, desc.groups, group_size, code.is_packed, q_min, q_max, desc.mode, bits, info
    )


class DeepSpeedQuantizePlan(_DeepSpeedPlan):
    """DeepSpeed's ``quantize`` / ``swizzle_quant`` / ``loco_swizzle_quant`` formulas on flat operands.

    Formula (:func:`quantplan.reference.deepspeed_format.swizzled_quantize`): per group,
    SYMMETRIC ``scale = 2**b / (2 * absmax)``, ``q = clamp(rne(v * scale), -2**(b-1), 2**(b-1) - 1)``,
    stored ``1 / scale``; ASYMMETRIC ``scale = 2**b / (max - min)``, ``offset = (max + min) / 2``,
    ``q = clamp(rne((v - offset) * scale), ...)``, stored ``(1 / scale, offset)``; codes and
    parameter rows in swizzled order ``[pipeline][device][node][group]``; int4 signed nibbles,
    element ``2i`` high. LoCo: ``v = x + e``, ``e <- b e + (1 - b)(v - dequant(q))`` in float32.

    **When to use:** through :mod:`quantplan.compat.deepspeed`; new code should prefer
    :class:`~quantplan.SwizzledQuantizePlan` (SPEC numerics, integer zero points).

    **Dtypes:** input F16 / BF16 / F32; codes int8 (or uint8) bytes; params float32; error
    buffer F16 / BF16 / F32.

    **Shape limits:** any group size (no multiple-of-8 rule, no 16384 / 40960 cap); ``groups``
    divides ``numel`` and, swizzled, ``nodes * devices_per_node * pipeline`` divides ``groups``;
    4-bit: even slices.

    **Kernel variants:** ``dense[...]`` (F16 / BF16 without LoCo, below 2**31 elements, aligned
    input, groups of ``team * 8 * nv``: registers only, division-free parameters and codes),
    ``lanes[...]`` (the same for one vector per thread of a team of 16 without a swizzle: groups
    of 128 on small problems) or ``cluster[...]`` (the same on sm_90 for few groups of ``8 * 8 * block`` elements, a
    thread-block cluster per group); otherwise the fused single pass (groups of at most 32768
    elements; 4-bit: even groups); an element-I/O twin for misaligned operands; two passes for
    larger groups.

    **Workspace:** 8 bytes per group on the CUDA two-pass path (``workspace_size()``), else none.

    **Precision guarantee:** float32 arithmetic, deterministic, bit-exact to the reference.
    """

    _args_type = DeepSpeedQuantizeArgs
    _category = types.OpCategory.QUANTIZE

    @classmethod
    def select(
        cls, stream: Any, desc: DeepSpeedQuantizeDescriptor, pref: types.PlanPreference | None = None
    ) -> DeepSpeedQuantizePlan:
        """Validate ``desc`` (InvalidProblem / Unsupported), pick the backend, compile and prepare the
        kernels (CUDA, first use)."""
        _check_groups(desc.numel, desc.groups)
        _check_bits(desc.num_bits, (4, 8))
        _qgz_launch.check_float_kind(desc.input_element, "input_element")
        _qgz_launch.check_error_kind(desc.error_element)
        for name in ("nodes", "devices_per_node", "pipeline"):
            check_positive(name, getattr(desc, name))
        slices = desc.nodes * desc.devices_per_node * desc.pipeline
        if desc.groups % slices:
            raise InvalidProblem(
                f"groups={desc.groups} must be a multiple of nodes * devices_per_node * pipeline_size = {slices} "
                f"(every slice holds whole groups)"
            )
        if desc.num_bits == 4 and (desc.numel // slices) % 2:
            raise InvalidProblem(
                f"4-bit codes pack two per byte: each of the {slices} slices must hold an even number of "
                f"elements, got {desc.numel // slices}"
            )
        backend, device_id = _backend(stream, pref, "deepspeed_quantize")
        choose_groups("deepspeed_quantize", _quantize_groups(desc), None, _forced(pref))  # a forced misfit raises
        launches = None if device_id is None or desc.numel == 0 else _prepare_quantize(desc, device_id, _forced(pref))
        code = deepspeed_code_kind(desc.num_bits)
        return cls(desc, backend, desc.input_element, code, desc.numel, device_id, launches, desc.groups)

    def _check(self, args: DeepSpeedQuantizeArgs) -> QgzOperands:
        d = self._d
        x = self._required(args.input, "input", (d.numel,), ELEMENTS[d.input_element])
        y = self._codes(args.output, "output", d.output_bytes)
        p = self._required(args.params_out, "params_out", d.param_shape, _F32)
        err, beta = self._loco(args.error_feedback, args.error_beta, (d.numel,), d.error_element)
        check_disjoint(("input", x), ("output", y), ("params_out", p), ("error_feedback", err))
        return QgzOperands(x, None, None, y, p, None, err, *beta_pair(beta))

    def _fields(self, params: Any, a: QgzOperands) -> None:
        params.x = a.x.ptr
        _output_args(params.out, a, self._d.num_bits, self._d.mode)

    def _reference(self, a: QgzOperands) -> None:
        d = self._d
        q, params, new_err = dsref.swizzled_quantize(
            host_view(a.x, ELEMENTS[d.input_element]),
            d.groups,
            d.num_bits,
            d.mode,
            d.nodes,
            d.devices_per_node,
            d.pipeline,
            _qgz_launch.error_view(a.err, d.error_element),
            a.beta,
        )
        _qgz_launch.write_reference_outputs(a, _DS_CODES, q, params, None, new_err, d.error_element)


# ---- dequantize (asymmetric; symmetric runs on DequantizePlan) ---------------------------------


class DeepSpeedDequantizeDescriptor(_GroupedCodes, Model):
    """DeepSpeed-format dequantization: ``numel`` codes in ``groups`` groups, ``num_bits`` 8 / 4,
    ``mode``, ``output_element`` F16 / BF16 / F32."""

    model_config = _FROZEN
    numel: int
    groups: int
    num_bits: int
    mode: QuantMode = QuantMode.ASYMMETRIC
    output_element: ElementKind

    @property
    def input_bytes(self) -> int:
        """Bytes of the flat code input."""
        return self.code_bytes


@dataclass(slots=True)
class DeepSpeedDequantizeArgs:
    """``input`` (flat int8 / uint8 codes), ``params`` (float32 ``param_shape``), ``output`` (flat floats)."""

    input: Any
    params: Any
    output: Any


def _peer_input(peers: int, peer_bytes: int, peer_groups: int, in_group: int) -> _qgz_launch.PeerSumArgs:
    """``PeerSumArgs`` of DeepSpeed-format peers (pointers set per call): summed, not averaged."""
    return _qgz_launch.PeerSumArgs(
        peer_bytes=peer_bytes,
        peer_params=peer_groups,
        in_group=in_group,
        peers=peers,
        average=0,
        peers_f=float(np.float32(peers)),
        in_group_shift=_qgz_launch.log2_or_minus_one(in_group),
    )


def _prepare_dequantize(desc: DeepSpeedDequantizeDescriptor, device_id: int) -> _qgz_launch.QgzLaunches:
    """Compile (first use) and prepare the launches of ``desc`` on ``device_id``: one peer's
    float values (``kernels/deepspeed_format.cu``: ``deepspeed_dequantize``)."""
    info = device_info(device_id)
    code_kind = deepspeed_code_kind(desc.num_bits)
    unit = deepspeed_dequantize_unit(desc.num_bits, desc.output_element)
    functions = load_kernels(_FAMILY, unit, info.arch, device_id, kernel_options())
    tags = (ELEMENTS[code_kind].cpp_tag, ELEMENTS[desc.output_element].cpp_tag)
    group_size = desc.numel // desc.groups
    return _qgz_launch.prepare_float_values(
        lambda v, vector_io: functions[template_name("deepspeed_dequantize", *tags, v, vector_io)],
        _DEQUANTIZE_PARAMS,
        _peer_input(1, desc.input_bytes, desc.groups, group_size),
        desc.numel,
        _qgz_launch.widest_dividing(group_size, QGZ_WIDTHS[0]),
        code_kind,
        desc.output_element,
        info,
    )


class DeepSpeedDequantizePlan(_DeepSpeedPlan):
    """DeepSpeed's ``dequantize``: ``x = q * p0`` (SYMMETRIC) or ``x = (q * p0) + p1`` (ASYMMETRIC).

    ``p0`` is the stored ``1 / scale`` and ``p1`` the midpoint offset of the element's group;
    float32, two roundings for ASYMMETRIC (no FMA), then one rounding to the output.

    **When to use:** through :mod:`quantplan.compat.deepspeed` (which runs SYMMETRIC on
    :class:`~quantplan.DequantizePlan`, the same formula).

    **Dtypes:** codes int8 / uint8 bytes (4-bit: high-nibble-first signed); params float32;
    output F16 / BF16 / F32.

    **Shape limits:** any group size; ``groups`` divides ``numel``; 4-bit: even ``numel``.

    **Workspace:** none.

    **Precision guarantee:** float32 arithmetic, bit-exact to the reference, deterministic.
    """

    _args_type = DeepSpeedDequantizeArgs
    _category = types.OpCategory.DEQUANTIZE
    _op = types.QuantizeKind.STATIC
    _has_out = False

    @classmethod
    def select(
        cls, stream: Any, desc: DeepSpeedDequantizeDescriptor, pref: types.PlanPreference | None = None
    ) -> DeepSpeedDequantizePlan:
        """Validate ``desc``, pick the backend, compile and prepare the kernels (CUDA, first use)."""
        _check_groups(desc.numel, desc.groups)
        _check_bits(desc.num_bits, (4, 8))
        _qgz_launch.check_float_kind(desc.output_element, "output_element")
        if desc.num_bits == 4 and desc.numel % 2:
            raise InvalidProblem(f"4-bit codes pack two per byte: numel must be even, got {desc.numel}")
        backend, device_id = _backend(stream, pref)
        launches = None if device_id is None or desc.numel == 0 else _prepare_dequantize(desc, device_id)
        code = deepspeed_code_kind(desc.num_bits)
        return cls(desc, backend, code, desc.output_element, desc.numel, device_id, launches)

    def _check(self, args: DeepSpeedDequantizeArgs) -> QgzOperands:
        d = self._d
        q = self._codes(args.input, "input", d.input_bytes)
        p = self._required(args.params, "params", d.param_shape, _F32)
        y = self._required(args.output, "output", (d.numel,), ELEMENTS[d.output_element])
        check_disjoint(("input", q), ("params", p), ("output", y))
        return QgzOperands(q, p, None, y, None, None)

    def _pointers(self, a: QgzOperands) -> tuple[int, ...]:
        return (a.x.ptr, a.x.ptr, a.y.ptr)

    def _fields(self, params: Any, a: QgzOperands) -> None:
        _input_args(params.input, a, self._d.mode)
        params.y = a.y.ptr

    def _reference(self, a: QgzOperands) -> None:
        d = self._d
        assert a.params is not None
        values = dsref.dequantize(_bytes(a.x), host_view(a.params, _F32), d.numel, d.groups, d.num_bits, d.mode)
        out = ELEMENTS[d.output_element]
        write_back(a.y, out, values.astype(out.numpy_dtype))


# ---- quantized_reduction / loco_quantized_reduction ----------------------------------------------


class DeepSpeedReduceDescriptor(Model):
    """DeepSpeed-format dequantize-reduce: ``numel`` input codes = ``devices_per_node`` chunks,
    ``in_groups`` input groups (``in_groups / dpn`` per chunk), ``out_groups`` output groups over
    the ``numel / dpn`` reduced elements; ``num_bits`` 8 / 4 (both sides); ``mode``;
    ``error_element`` None or the LoCo buffer's element."""

    model_config = _FROZEN
    numel: int
    in_groups: int
    out_groups: int
    num_bits: int
    mode: QuantMode = QuantMode.SYMMETRIC
    devices_per_node: int
    error_element: ElementKind | None = None

    @property
    def chunk_elements(self) -> int:
        """Elements per peer chunk, and of the output: ``numel / devices_per_node``."""
        return self.numel // max(1, self.devices_per_node)

    @property
    def input_bytes(self) -> int:
        """Bytes of the flat code input."""
        return _storage_bytes(self.numel, self.num_bits)

    @property
    def output_bytes(self) -> int:
        """Bytes of the flat code output."""
        return _storage_bytes(self.chunk_elements, self.num_bits)

    @property
    def input_param_shape(self) -> tuple[int, int]:
        """``(in_groups, 1|2)``."""
        return (self.in_groups, dsref.params_per_group(self.mode))

    @property
    def param_shape(self) -> tuple[int, int]:
        """``(out_groups, 1|2)``."""
        return (self.out_groups, dsref.params_per_group(self.mode))


@dataclass(slots=True)
class DeepSpeedReduceArgs:
    """``input`` (flat codes, ``input_bytes``), ``params`` (float32 ``input_param_shape``),
    ``output`` (flat codes, ``output_bytes``), ``params_out`` (float32 ``param_shape``); LoCo:
    ``error_feedback`` (flat, ``chunk_elements``, updated in place) and ``error_beta``."""

    input: Any
    params: Any
    output: Any
    params_out: Any
    error_feedback: Any = None
    error_beta: Any = None


def _prepare_reduce(desc: DeepSpeedReduceDescriptor, device_id: int, forced: str | None) -> _qgz_launch.QgzLaunches:
    """Compile (first use) and prepare the launches of ``desc`` on ``device_id`` (``forced``: the
    schedule ``PlanPreference`` forces)."""
    info = device_info(device_id)
    code = ELEMENTS[deepspeed_code_kind(desc.num_bits)]
    unit = deepspeed_reduce_unit(desc.num_bits, desc.error_element)
    functions = load_kernels(_FAMILY, unit, info.arch, device_id, kernel_options())
    tags = (code.cpp_tag, error_tag(desc.error_element))
    chunk = desc.chunk_elements
    peer_groups = desc.in_groups // desc.devices_per_node
    in_group = chunk // peer_groups
    kernels = _qgz_launch.QgzKernels(
        lambda vec, vector_io: functions[template_name("deepspeed_reduce_segments", *tags, vec, vector_io)],
        functions[template_name("deepspeed_reduce_group_params", *tags)],
        functions[template_name("deepspeed_reduce_elements", *tags)],
        _REDUCE_PARAMS,
        dict(input=_peer_input(desc.devices_per_node, desc.output_bytes, peer_groups, in_group)),
    )
    # Peer codes (base and peer stride), output codes, and the error buffer.
    bits = [code.storage_bits] * 3
    if desc.error_element is not None:
        bits.append(ELEMENTS[desc.error_element].storage_bits)
    # A vector of codes never crosses an input group: its width divides the input group size.
    vec_in = _qgz_launch.widest_dividing(in_group, QGZ_WIDTHS[0])
    out_group = chunk // desc.out_groups
    geometry = (
        None
        if code.is_packed and vec_in < 2
        else _qgz_launch.qgz_geometry(desc.out_groups, out_group, code.is_packed, vec_in, info)
    )
    q_min, q_max = dsref.code_bounds(desc.num_bits)
    # Without LoCo, input groups of whole vectors of 8 and output groups of team * 8 * nv: the dense pass.
    loco = desc.error_element is not None
    choice = choose_reduce(desc.out_groups, out_group, in_group, desc.numel, geometry is not None, loco, forced)
    if choice.schedule == "two-pass":
        geometry = None
    elif choice.schedule == "fused-element-io" and geometry is not None:
        geometry = (geometry[1], geometry[1])
    dense = None
    if choice.schedule == "dense":
        team, nv = choice.team, choice.nv
        fn = functions[deepspeed_reduce_dense_name(desc.num_bits, desc.mode is QuantMode.ASYMMETRIC, nv)]
        tag = f"dense[{team}t-per-group,{nv}vec8-per-thread,{desc.devices_per_node}-peer-sum]"
        # Few groups: smaller blocks (down to 64 threads, one group) spread the peer sums over
        # more multiprocessors.
        block = DS_DENSE_BLOCK
        while block > max(64, team) and -(-desc.out_groups // (block // team)) < 2 * info.sm_count:
            block //= 2
        dense = _Dense(_qgz_launch.DenseLaunch(fn, team, 8, tag), block, -(-desc.out_groups // (block // team)))
    launches = _qgz_launch.prepare_qgz_launches(
        kernels,
        geometry,
        desc.out_groups,
        out_group,
        chunk // (2 if code.is_packed else 1),
        q_min,
        q_max,
        desc.mode,
        bits,
        info,
        own_range=True,
        dense=None if dense is None else dense.launch,
    )
    return _with_dense(launches, dense, kernels, None, bits)


class DeepSpeedReducePlan(_DeepSpeedPlan):
    """DeepSpeed's ``quantized_reduction`` / ``loco_quantized_reduction`` formulas.

    Formula (:func:`quantplan.reference.deepspeed_format.quantized_reduction`): chunk ``j``
    dequantized with its own rows (``q * p0 (+ p1)``, float32), summed in float32 in peer order
    (not averaged), ``+ e`` with LoCo, re-quantized with DeepSpeed's group formula in
    ``out_groups`` groups (stored ``1 / scale`` (+ offset)); LoCo update as
    :func:`quantplan.reference.loco_error_update`.

    **When to use:** through :mod:`quantplan.compat.deepspeed`; new code should prefer
    :class:`~quantplan.DequantReducePlan`.

    **Dtypes:** codes int8 / uint8 bytes; params float32; error buffer F16 / BF16 / F32.

    **Shape limits:** any group sizes; ``in_groups`` divides ``numel`` and is a multiple of
    ``devices_per_node``; ``out_groups`` divides ``numel / devices_per_node``; 4-bit: even chunks.

    **Kernel variants:** ``dense[...]`` without LoCo for output groups of ``team * 8`` (up to
    2048) and input groups of whole vectors of 8 (the peers' codes decoded and summed in
    registers); otherwise as :class:`DeepSpeedQuantizePlan`'s fused and two-pass kernels over the
    output groups (the peers' codes are read in vectors within one input group).

    **Workspace:** 8 bytes per output group on the CUDA two-pass path, else none.

    **Precision guarantee:** float32 dequantization and sum (DeepSpeed sums in fp16), fixed
    order, bit-exact to the reference, deterministic.
    """

    _args_type = DeepSpeedReduceArgs
    _category = types.OpCategory.COLLECTIVE

    @classmethod
    def select(
        cls, stream: Any, desc: DeepSpeedReduceDescriptor, pref: types.PlanPreference | None = None
    ) -> DeepSpeedReducePlan:
        """Validate ``desc``, pick the backend, compile and prepare the kernels (CUDA, first use)."""
        _check_groups(desc.numel, desc.in_groups)
        _check_bits(desc.num_bits, (4, 8))
        check_positive("devices_per_node", desc.devices_per_node)
        check_positive("out_groups", desc.out_groups)
        _qgz_launch.check_error_kind(desc.error_element)
        if desc.in_groups % desc.devices_per_node:
            raise InvalidProblem(
                f"in_groups={desc.in_groups} must be a multiple of devices_per_node={desc.devices_per_node} "
                f"(each peer chunk holds whole groups)"
            )
        if desc.chunk_elements % desc.out_groups:
            raise InvalidProblem(
                f"out_groups={desc.out_groups} does not divide the {desc.chunk_elements} reduced elements"
            )
        if desc.num_bits == 4 and desc.chunk_elements % 2:
            raise InvalidProblem(f"4-bit codes pack two per byte: chunks must be even, got {desc.chunk_elements}")
        backend, device_id = _backend(stream, pref, "deepspeed_reduce")
        launches = None if device_id is None or desc.numel == 0 else _prepare_reduce(desc, device_id, _forced(pref))
        code = deepspeed_code_kind(desc.num_bits)
        return cls(desc, backend, code, code, desc.numel, device_id, launches, desc.out_groups)

    def _check(self, args: DeepSpeedReduceArgs) -> QgzOperands:
        d = self._d
        q = self._codes(args.input, "input", d.input_bytes)
        p = self._required(args.params, "params", d.input_param_shape, _F32)
        y = self._codes(args.output, "output", d.output_bytes)
        p_out = self._required(args.params_out, "params_out", d.param_shape, _F32)
        err, beta = self._loco(args.error_feedback, args.error_beta, (d.chunk_elements,), d.error_element)
        check_disjoint(("input", q), ("params", p), ("output", y), ("params_out", p_out), ("error_feedback", err))
        return QgzOperands(q, p, None, y, p_out, None, err, *beta_pair(beta))

    def _pointers(self, a: QgzOperands) -> tuple[int, ...]:
        peer_bytes = _storage_bytes(self._d.chunk_elements, self._d.num_bits)
        pointers = (a.x.ptr, a.x.ptr + peer_bytes, a.y.ptr)
        return pointers if a.err is None else (*pointers, a.err.ptr)

    def _fields(self, params: Any, a: QgzOperands) -> None:
        _input_args(params.input, a, self._d.mode)
        _output_args(params.out, a, self._d.num_bits, self._d.mode)

    def _reference(self, a: QgzOperands) -> None:
        d = self._d
        assert a.params is not None
        codes, params, new_err = dsref.quantized_reduction(
            _bytes(a.x),
            host_view(a.params, _F32),
            d.numel,
            d.in_groups,
            d.out_groups,
            d.num_bits,
            d.mode,
            d.devices_per_node,
            _qgz_launch.error_view(a.err, d.error_element),
            a.beta,
        )
        _qgz_launch.write_reference_outputs(a, _DS_CODES, codes, params, None, new_err, d.error_element)


# ---- MoQ fake quantization -----------------------------------------------------------------------


class MoQFakeQuantizeDescriptor(Model):
    """DeepSpeed MoQ fake quantization: ``numel`` elements in ``groups`` groups, ``num_bits`` 1 to 8,
    ``mode``, ``rounding`` NEAREST_EVEN or STOCHASTIC, ``element`` F16 / BF16 / F32 (in and out).
    ``stochastic`` is True for STOCHASTIC rounding."""

    model_config = _FROZEN
    numel: int
    groups: int
    num_bits: int
    mode: QuantMode = QuantMode.SYMMETRIC
    rounding: Rounding = Rounding.NEAREST_EVEN
    element: ElementKind

    @property
    def stochastic(self) -> bool:
        """True for ``Rounding.STOCHASTIC`` (the kernels' template flag)."""
        return self.rounding is Rounding.STOCHASTIC


@dataclass(slots=True)
class MoQFakeQuantizeArgs:
    """``input`` and ``output`` (flat, same dtype; ``output`` may be ``input``); with
    ``Rounding.STOCHASTIC``: ``rng_seed`` / ``rng_offset`` (ints in [0, 2**64), SPEC section 4 Philox)."""

    input: Any
    output: Any
    rng_seed: Any = None
    rng_offset: Any = None


def _moq_groups(desc: MoQFakeQuantizeDescriptor) -> GroupProblem:
    """What the group schedules read of ``desc``: the specialised passes serve SYMMETRIC nearest rounding."""
    fast = not desc.stochastic and desc.mode is QuantMode.SYMMETRIC
    return GroupProblem(desc.groups, desc.numel // desc.groups, desc.element, False, fast)


def _prepare_moq(desc: MoQFakeQuantizeDescriptor, device_id: int, forced: str | None) -> _qgz_launch.QgzLaunches:
    """Compile (first use) and prepare the launches of ``desc`` on ``device_id`` (``forced``: the
    schedule ``PlanPreference`` forces)."""
    info = device_info(device_id)
    unit = moq_fake_quantize_unit(desc.element, desc.rounding)
    functions = load_kernels(_FAMILY, unit, info.arch, device_id, kernel_options())
    tag = ELEMENTS[desc.element].cpp_tag
    group_size = desc.numel // desc.groups
    kernels = _qgz_launch.QgzKernels(
        lambda vec, vector_io: functions[
            template_name("moq_fake_quantize_segments", tag, desc.stochastic, vec, vector_io)
        ],
        functions[template_name("moq_fake_quantize_group_params", tag)],
        functions[template_name("moq_fake_quantize_elements", tag, desc.stochastic)],
        _MOQ_PARAMS,
        {},
    )
    bits = [ELEMENTS[desc.element].storage_bits] * 2
    # SYMMETRIC nearest rounding of aligned 16-bit groups: the dense or cluster pass.
    choice = choose_groups("moq_fake_quantize", _moq_groups(desc), info, forced)
    dense = _dense_pass(
        choice, desc.groups, lambda nv: moq_dense_name(desc.element, nv), moq_cluster_name(desc.element), functions
    )
    return _group_launches(kernels, choice.schedule, dense, desc.groups, group_size, False, 0, 0, desc.mode, bits, info)


class MoQFakeQuantizePlan(_DeepSpeedPlan):
    """DeepSpeed's MoQ fake quantization (``ds_quantize_*`` / ``ds_sr_quantize_*``), defects fixed.

    Formula: :func:`quantplan.reference.deepspeed_format.moq_fake_quantize` (SYMMETRIC
    ``scale = 2**b / (2 * absmax + 1e-5)``, ``x <- clamp(rne(x * scale)) / scale``; ASYMMETRIC
    ``step = (max - min + 1e-5) / 2**b``, ``x <- round_half_away((x - min) / step) * step + min``;
    stochastic variants round with Philox uniforms, element ``i`` using SPEC section 4's stream).
    Unlike DeepSpeed, the stochastic ASYMMETRIC variant runs the asymmetric formula and the F32
    SYMMETRIC variant returns ``q / scale`` (not the integer ``q``).

    **When to use:** through :mod:`quantplan.compat.deepspeed`; new QAT code should prefer
    :class:`~quantplan.DynamicRangeFakeQuantizePlan`.

    **Dtypes:** F16 / BF16 / F32 in and out.

    **Shape limits:** any group size (no ~1M-element cap); ``groups`` divides ``numel``.

    **Kernel variants:** as :class:`DeepSpeedQuantizePlan` (the dense and cluster passes serve
    SYMMETRIC nearest rounding only); ``output`` may be ``input`` (in place).
    On the CUDA backend ``rng_seed`` / ``rng_offset`` are Python integers.

    **Workspace:** 8 bytes per group on the CUDA two-pass path (groups above 32768 elements), else none.

    **Precision guarantee:** float32 arithmetic, bit-exact to the reference, deterministic for a
    given seed and offset.
    """

    _args_type = MoQFakeQuantizeArgs
    _category = types.OpCategory.FAKE_QUANTIZE

    @classmethod
    def select(
        cls, stream: Any, desc: MoQFakeQuantizeDescriptor, pref: types.PlanPreference | None = None
    ) -> MoQFakeQuantizePlan:
        """Validate ``desc``, pick the backend, compile and prepare the kernels (CUDA, first use)."""
        _check_groups(desc.numel, desc.groups)
        _check_bits(desc.num_bits, tuple(range(1, 9)))
        _qgz_launch.check_float_kind(desc.element, "element")
        backend, device_id = _backend(stream, pref, "moq_fake_quantize")
        choose_groups("moq_fake_quantize", _moq_groups(desc), None, _forced(pref))  # a forced misfit raises
        launches = None if device_id is None or desc.numel == 0 else _prepare_moq(desc, device_id, _forced(pref))
        return cls(desc, backend, desc.element, desc.element, desc.numel, device_id, launches, desc.groups)

    def _check(self, args: MoQFakeQuantizeArgs) -> QgzOperands:
        d = self._d
        info = ELEMENTS[d.element]
        x = self._required(args.input, "input", (d.numel,), info)
        y = self._required(args.output, "output", (d.numel,), info)
        seed: Any = None
        offset: Any = None
        if d.stochastic:
            seed, offset = self._rng(True, args.rng_seed, args.rng_offset)
            if self._launches is not None and not (isinstance(seed, int) and isinstance(offset, int)):
                raise InvalidProblem("on the CUDA backend rng_seed / rng_offset are Python integers in [0, 2**64)")
        elif args.rng_seed is not None or args.rng_offset is not None:
            raise InvalidProblem("rng_seed / rng_offset apply only to stochastic plans; leave them None")
        same_or_disjoint(y, "output", x, "input")
        return QgzOperands(x, None, None, y, None, None, seed=seed, offset=offset)

    def _fields(self, params: Any, a: QgzOperands) -> None:
        params.x = a.x.ptr
        _output_args(params.out, a, self._d.num_bits, self._d.mode)
        params.out.seed = a.seed or 0
        params.out.offset = a.offset or 0

    def _reference(self, a: QgzOperands) -> None:
        d = self._d
        uniform = reference_uniform((d.numel,), a.seed, a.offset) if d.stochastic else None
        info = ELEMENTS[d.element]
        write_back(a.y, info, dsref.moq_fake_quantize(host_view(a.x, info), d.groups, d.num_bits, d.mode, uniform))


__all__ = [
    "DeepSpeedDequantizeArgs",
    "DeepSpeedDequantizeDescriptor",
    "DeepSpeedDequantizePlan",
    "DeepSpeedQuantizeArgs",
    "DeepSpeedQuantizeDescriptor",
    "DeepSpeedQuantizePlan",
    "DeepSpeedReduceArgs",
    "DeepSpeedReduceDescriptor",
    "DeepSpeedReducePlan",
    "MoQFakeQuantizeArgs",
    "MoQFakeQuantizeDescriptor",
    "MoQFakeQuantizePlan",
]
