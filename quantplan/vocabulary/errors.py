"""Exception classes of quantplan, and the error contract every public entry point keeps.

The contract (descriptors, scopes, ``PlanPreference``, ``select``, ``can_implement``, ``run``,
the functional layer, ``compat``, ``pytorch`` and ``distributed``):

* every invalid input raises a :class:`QuantPlanError` subclass, so ``except qp.QuantPlanError``
  catches anything this library raises on purpose; descriptor, scope and preference validation
  (pydantic underneath) is raised as :class:`InvalidProblem` too;
* :class:`InvalidProblem` (and its subclasses) is also a ``ValueError``; an argument of the wrong
  type (an Args object of another plan, a dict, a string as workspace or stream, something that
  is no array) raises :class:`InvalidArgumentType`, which is both an :class:`InvalidProblem` and
  a ``TypeError``;
* it is raised before anything is launched or written: outputs are left untouched;
* the message names the operand or field, what was expected and how to fix it;
* the two backends agree: the NumPy reference backend refuses exactly what the CUDA backend
  refuses (overlap on real address ranges, alignment, read-only outputs, streams, workspaces).

Not checked on the hot path: the values inside array parameters (NaN, zero or negative entries
of a scale array, zero points outside the code range). ``PlanPreference(validate_values=True)``
makes the checked ``run`` inspect them and raise InvalidProblem naming the first bad index.
"""

from __future__ import annotations

from typing import Any


class QuantPlanError(Exception):
    """Base class of every error quantplan raises on purpose."""


class Unsupported(QuantPlanError):
    """A valid request that this library (or this backend / GPU) does not serve."""


class InvalidProblem(QuantPlanError, ValueError):
    """A malformed request: bad descriptor field, or arguments that do not match the plan."""


class InvalidArgumentType(InvalidProblem, TypeError):
    """An argument of the wrong type (Args class, workspace, stream, descriptor, preference, array):
    both an :class:`InvalidProblem` and a ``TypeError``."""


class MisalignedOperand(InvalidProblem):
    """An operand's pointer or strides break the alignment or layout the kernel needs."""


class WorkspaceTooSmall(InvalidProblem):
    """The workspace passed to ``run`` is smaller than ``plan.workspace_size()``."""


class KernelCompileError(QuantPlanError):
    """NVRTC rejected a kernel. ``log`` holds the full compiler log."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}\n--- NVRTC log ---\n{log}")
        self.message = message
        self.log = log

    def __reduce__(self) -> tuple[type[KernelCompileError], tuple[str, str]]:
        # Rebuilt from both arguments: it crosses process boundaries (precompile's worker pool).
        return type(self), (self.message, self.log)


__all__ = [
    "InvalidArgumentType",
    "InvalidProblem",
    "KernelCompileError",
    "MisalignedOperand",
    "QuantPlanError",
    "Unsupported",
    "WorkspaceTooSmall",
    "check_descriptor",
]


def check_descriptor(desc: Any, expected: type) -> None:
    """InvalidArgumentType unless ``desc`` (given to ``select``) is an ``expected`` descriptor."""
    if not isinstance(desc, expected):
        raise InvalidArgumentType(
            f"desc must be a {expected.__name__}, got {type(desc).__name__}; build it as qp.{expected.__name__}(...)"
        )
