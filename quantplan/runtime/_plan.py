"""The one plan skeleton: identity, introspection and the ``run`` template every plan shares.

A plan is made once by its ``select`` (validation, backend choice, kernel compilation and launch
preparation) and run many times. :class:`Plan` holds what every plan has:

* identity: ``problem`` (the validated descriptor), ``backend``, ``device_id``, arch, variant,
  op category and kind, element and aux element, arithmetic precision;
* ``sku``, ``precision_guarantee``, ``workspace_size``, ``can_implement`` and ``__repr__``;
* ``run(stream, workspace, args, *, check=True)``, a template method: workspace check ->
  ``_check`` (the operands as one immutable record per plan family: a ``NamedTuple``, which
  costs a microsecond less per run than a frozen dataclass) -> ``_run_reference`` on the
  reference backend, else ``_launch`` (skipped for an empty problem). ``check=False`` replaces
  the checks by ``_extract``, which reads only each array's pointer (``_extract_fields``).

A subclass writes ``select`` (a classmethod ending in ``cls(...)``), ``_check``,
``_run_reference`` and ``_launch``, and names its record and Args fields for ``_extract``.
Hot-path rules: everything the launch needs is resolved at ``select``; ``run`` builds no
closures, f-strings or dtypes outside error branches and makes one driver launch per kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar, Generic, TypeVar

from quantplan.runtime._device import cuda_available, device_info
from quantplan.runtime._fast_check import CallCache
from quantplan.runtime._launch import PreparedLaunch, check_stream, stream_handle
from quantplan.runtime._operands import pointer_view
from quantplan.runtime.workspace import Workspace, check_workspace
from quantplan.vocabulary.elements import acc_element
from quantplan.vocabulary.errors import InvalidArgumentType, Unsupported, check_descriptor
from quantplan.vocabulary.types import (
    HOST_ARCH,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    QuantizeKind,
)

ArgsT = TypeVar("ArgsT")
CheckedT = TypeVar("CheckedT")
PlanT = TypeVar("PlanT", bound="Plan[Any, Any]")

#: ``variant`` of every plan on the reference backend.
REFERENCE_VARIANT = "numpy"


def snapshot(descriptor: Any, *derived: str) -> SimpleNamespace:
    """A frozen descriptor's fields and the ``derived`` properties named, as plain attributes, so
    the checks of ``run`` read them without recomputing a property (or touching pydantic)."""
    values = dict(descriptor)
    values.update((name, getattr(descriptor, name)) for name in derived)
    return SimpleNamespace(**values)


def preferred(plan: PlanT, pref: PlanPreference | None) -> PlanT:
    """``plan`` (just made by ``select``) with the per-call options of ``pref`` applied:
    ``validate_values`` (the checked calls inspect the values of array parameters)."""
    if pref is not None and pref.validate_values:
        plan._validate_values = True
    return plan


def choose_backend(pref: PlanPreference | None, stream: Any = None, schedules: tuple[str, ...] = ()) -> BackendKind:
    """CUDA when a GPU is present (or demanded), else REFERENCE. ``pref`` must be None or a
    PlanPreference and ``stream`` a stream ``run`` takes (both backends: InvalidArgumentType).
    ``schedules``: the names the calling plan accepts in ``PlanPreference.schedule`` (none: the
    plan takes no forced schedule); any other forced name is Unsupported, on both backends."""
    if stream is not None:
        check_stream(stream)
    if pref is not None and not isinstance(pref, PlanPreference):
        raise InvalidArgumentType(
            f"pref must be None or a quantplan.PlanPreference, got {type(pref).__name__}; "
            f"pass e.g. qp.PlanPreference(backend=qp.BackendKind.REFERENCE)"
        )
    if pref is not None and pref.schedule is not None and pref.schedule not in schedules:
        raise Unsupported(
            f"PlanPreference(schedule={pref.schedule!r}): "
            + (
                f"this plan's schedules are {', '.join(schedules)}"
                if schedules
                else "this plan takes no forced schedule"
            )
        )
    wanted = None if pref is None else pref.backend
    if wanted is BackendKind.REFERENCE:
        return BackendKind.REFERENCE
    if cuda_available():
        return BackendKind.CUDA
    if wanted is BackendKind.CUDA:
        raise Unsupported("PlanPreference(backend=CUDA) but no CUDA GPU is visible (CuPy sees no device)")
    return BackendKind.REFERENCE


class Plan(Generic[ArgsT, CheckedT]):
    """Base of every plan: identity, introspection and the checked / unchecked ``run``.

    Class attributes a subclass sets: ``_category`` (:class:`OpCategory`) and ``_op``
    (:class:`QuantizeKind`). Everything else is per instance, passed to :meth:`__init__` by the
    subclass's ``select``.
    """

    _category: ClassVar[OpCategory]
    _op: ClassVar[QuantizeKind] = QuantizeKind.STATIC
    #: ``run(..., check=False)``: the operand record, built from the Args attributes named in
    #: ``_extract_fields`` (in its field order; an attribute the Args lack reads as None), each
    #: array read as its pointer (``pointer_view``) and scalars passed as given.
    _checked: ClassVar[Callable[..., Any]]
    #: The Args class ``run`` / ``can_implement`` take (a subclass instance is accepted too).
    _args_type: ClassVar[type]
    #: ``PlanPreference(validate_values=True)`` at select: the checked calls inspect parameter values.
    _validate_values: bool = False
    _extract_fields: ClassVar[tuple[str, ...]] = ()
    #: ``_launch`` only stores into the prepared argument blocks and launches them (through
    #: ``launch_on``): the fast path may replay it as traced stores (:mod:`quantplan.runtime._fast_check`).
    _launch_traceable: ClassVar[bool] = True

    def __init__(
        self,
        problem: Any,
        device_id: int | None,
        element: ElementKind,
        aux_element: ElementKind,
        variant: str = REFERENCE_VARIANT,
        *,
        workspace_bytes: int = 0,
        prepared: tuple[PreparedLaunch, ...] = (),
        empty: bool | None = None,
        backend: BackendKind | None = None,
        arch: str | None = None,
    ) -> None:
        """``device_id`` None: the reference backend on the host; else CUDA on that device.
        ``empty`` (default: ``problem.numel == 0``): nothing to launch. ``problem.precision``
        (float32 where the problem has none) is the arithmetic of the precision guarantee."""
        cuda = device_id is not None
        self.problem = problem
        self.backend = backend or (BackendKind.CUDA if cuda else BackendKind.REFERENCE)
        self.device_id = device_id
        self._arch_name = arch or (device_info(device_id).arch.name if device_id is not None else HOST_ARCH.name)
        self._variant = variant
        self._element = element
        self._aux_element = aux_element
        self._precision: MathPrecision = getattr(problem, "precision", MathPrecision.F32)
        self._workspace_bytes = workspace_bytes
        #: The kernels this plan launches (empty on REFERENCE): grid, block and function attributes.
        self._prepared = prepared
        self._is_reference = self.backend is BackendKind.REFERENCE
        #: Nothing to launch: ``run`` returns after the checks (CUDA backend).
        self._empty = problem.numel == 0 if empty is None else empty
        #: Signatures of the calls that passed the checks, and of unchecked calls (``run``'s fast path):
        #: ``_fast[check]`` lists the generated functions ``run`` tries first.
        self._calls = CallCache()
        self._fast = self._calls.fast
        #: Which generated function last wrote the argument blocks (None: ``_launch`` did): a fast
        #: function skips its stores of constants when it did.
        self._tail_owner: list[object | None] = [None]

    # ---- introspection ----------------------------------------------------------------------

    def workspace_size(self) -> int:
        """Bytes of workspace ``run`` needs (0: pass None). See the plan's **Workspace** section."""
        return self._workspace_bytes

    def precision_guarantee(self) -> PrecisionGuarantee:
        """Arithmetic type of the plan (float32, float64 for F64 data) and of its reductions;
        bit-exact to the reference and deterministic (see the plan's **Precision guarantee**)."""
        return PrecisionGuarantee(math_precision=self._precision, accumulator=acc_element(self._precision))

    def sku(self) -> KernelSku:
        """Identity of the selected kernels: category, op, element, aux element, variant, arch, backend."""
        return KernelSku(
            category=self._category,
            op=self._op,
            element=self._element,
            aux_element=self._aux_element,
            variant=self._variant,
            arch=self._arch_name,
            backend=self.backend,
            precision_guarantee=self.precision_guarantee(),
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(op={self._category.value}/{self._op.value}, variant={self._variant!r}, "
            f"backend={self.backend.value}, arch={self._arch_name})"
        )

    # ---- arguments --------------------------------------------------------------------------

    def can_implement(self, args: ArgsT) -> bool:
        """Check ``args`` against the plan (shapes, dtypes, residence, contiguity, alignment,
        overlap, parameters). Returns True, or raises InvalidProblem / MisalignedOperand naming
        the offending argument."""
        if type(args) is not self._args_type:
            self._check_args_type(args)
        checked = self._check(args)
        if self._validate_values:
            self._check_values(checked)
        return True

    def _check_args_type(self, args: Any) -> None:
        """InvalidArgumentType unless ``args`` is an instance of the plan's Args class."""
        expected = self._args_type
        if not isinstance(args, expected):
            raise InvalidArgumentType(
                f"args must be a {expected.__name__}, got {type(args).__name__}; build it as "
                f"qp.{expected.__name__}(...) with this plan's fields"
            )

    def _check_values(self, checked: CheckedT) -> None:
        """``PlanPreference(validate_values=True)``: the values of the array parameters of a checked
        call (the plan family overrides it; the base checks nothing)."""

    def _check(self, args: ArgsT) -> CheckedT:
        """Every operand check; the operands the launch needs, as the plan's frozen dataclass."""
        raise NotImplementedError

    def _extract(self, args: ArgsT) -> CheckedT:
        """The operands of ``run(..., check=False)``, read without checks (see ``_extract_fields``)."""
        return self._checked(*[pointer_view(getattr(args, name, None), name) for name in self._extract_fields])  # type: ignore[no-any-return]

    # ---- execution --------------------------------------------------------------------------

    def run(self, stream: Any, workspace: Workspace | None, args: ArgsT, *, check: bool = True) -> None:
        """Run on ``stream`` (a CuPy / PyTorch stream, a raw ``cudaStream_t``, or None for CuPy's
        current stream): no allocation, no synchronisation, no compilation, capturable in a CUDA
        graph; NumPy on the reference backend. Every check runs before anything is launched or
        written. ``check=False`` skips the checks (the caller vouches for ``args`` and
        ``workspace``); a zero-size problem launches nothing."""
        for fast in self._fast[check]:  # a call like a remembered one (_fast_check): done in one function
            if fast(args, workspace, stream):
                return
        self._run_slow(stream, workspace, args, check)

    def _run_slow(self, stream: Any, workspace: Workspace | None, args: ArgsT, check: bool) -> None:
        """``run`` without a remembered signature: the checks (or ``_extract``), the launch, and the
        call remembered for the fast path (CUDA; not with value checks, which read the arrays)."""
        if self._is_reference:
            self._run_reference(self._check_call(stream, workspace, args) if check else self._extract(args))
            return
        checked = self._check_call(stream, workspace, args) if check else self._extract(args)
        handle = stream_handle(stream)
        if not self._empty:
            self._tail_owner[0] = None
            self._launch(handle, workspace, checked)
        if check:
            if not self._validate_values:
                self._calls.remember(self, stream, workspace, args, checked)
        else:
            self._calls.remember_unchecked(self, stream, workspace, args, checked)

    def _check_call(self, stream: Any, workspace: Workspace | None, args: ArgsT) -> CheckedT:
        """Every check of one call, before anything is launched or written: the workspace, then the
        operands (``_check``). The checked ``run`` goes through here."""
        if type(args) is not self._args_type:
            self._check_args_type(args)
        if workspace is not None or self._workspace_bytes:
            check_workspace(workspace, self._workspace_bytes, not self._is_reference)
        if stream is not None:
            check_stream(stream)
        checked = self._check(args)
        if self._validate_values:
            self._check_values(checked)
        return checked

    def _run_reference(self, checked: CheckedT) -> None:
        """The NumPy reference of the op, written into the caller's arrays."""
        raise NotImplementedError

    def _launch(self, handle: int, workspace: Workspace | None, checked: CheckedT) -> None:
        """Write the per-call fields of the prepared launches and enqueue them on ``handle``."""
        raise NotImplementedError


__all__ = ["REFERENCE_VARIANT", "Plan", "check_descriptor", "choose_backend", "preferred", "snapshot"]
