"""The :class:`Operand` record: what quantplan reads of one array argument. Its own module, below
the operand rules (``_operands``) and the launch kit (``_launch``), which both take it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Operand:
    """What quantplan needs of one tensor argument.

    ``device_id`` is None for host (NumPy) arrays. ``ptr`` is the address of the first element
    (NumPy included, so overlap and alignment are judged alike on both backends; 0 for PyTorch CPU
    tensors, which no plan takes).
    """

    obj: Any
    ptr: int
    shape: tuple[int, ...]
    dtype_name: str
    itemsize: int
    contiguous: bool
    device_id: int | None

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


__all__ = ["Operand"]
