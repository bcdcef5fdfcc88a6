"""Exception classes of quantplan.

Every error names the value received, the rule it broke and the fix. All derive from
:class:`QuantPlanError`, so ``except qp.QuantPlanError`` catches anything this library raises
on purpose. Errors are raised before any kernel launch; outputs are left untouched.
"""

from __future__ import annotations


class QuantPlanError(Exception):
    """Base class of every error quantplan raises on purpose."""


class Unsupported(QuantPlanError):
    """A valid request that this library (or this backend / GPU) does not serve."""


class InvalidProblem(QuantPlanError, ValueError):
    """A malformed request: bad descriptor field, or arguments that do not match the plan."""


class MisalignedOperand(InvalidProblem):
    """An operand's pointer or strides break the alignment or layout the kernel needs."""


class WorkspaceTooSmall(InvalidProblem):
    """The workspace passed to ``run`` is smaller than ``plan.workspace_size()``."""


class KernelCompileError(QuantPlanError):
    """NVRTC rejected a kernel. ``log`` holds the full compiler log."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}\n--- NVRTC log ---\n{log}")
        self.log = log


__all__ = [
    "InvalidProblem",
    "KernelCompileError",
    "MisalignedOperand",
    "QuantPlanError",
    "Unsupported",
    "WorkspaceTooSmall",
]
