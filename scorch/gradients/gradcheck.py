"""``torch.autograd.gradcheck`` / ``gradgradcheck`` on functions of scorch sparse tensors.

torch's checks perturb an input element by element through indexing writes; a scorch tensor
reads as strided to them, so they would perturb every position of its dense shape, where
writing a non-zero outside the pattern is refused (and the numerical Jacobian would hold
derivatives the pattern's gradient does not have). A sparse tensor's gradient is the
gradient of its stored values (API.md section 7), so the check is run on them: each sparse
input that requires grad enters as its values (a leaf), rebuilt on its pattern inside the
function, and a sparse output leaves as its dense form. Calls with no sparse tensor go to
torch's functions unchanged. Installed over ``torch.autograd.gradcheck`` /
``gradgradcheck`` on import (torch's own functions otherwise).
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from ..tensor_type import SparseTensor
from .values import from_values

__all__ = ["install"]


def _dense_outputs(out):
    if isinstance(out, SparseTensor):
        return out.to_dense()
    if isinstance(out, (tuple, list)):
        return type(out)(_dense_outputs(o) for o in out)
    return out


def _on_values(fn: Callable, inputs):
    """``(fn', inputs')``: the sparse inputs that require grad replaced by their values,
    or None where no input is sparse."""
    items = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    sparse = {k: x._storage for k, x in enumerate(items)
              if isinstance(x, SparseTensor) and x.requires_grad}
    if not sparse and not any(isinstance(x, SparseTensor) for x in items):
        return None
    swapped = tuple(x._storage.values.detach().clone().requires_grad_() if k in sparse else x
                    for k, x in enumerate(items))

    def on_patterns(*args):
        args = [from_values(sparse[k], a) if k in sparse else a for k, a in enumerate(args)]
        return _dense_outputs(fn(*args))
    return on_patterns, swapped


def _wrapping(check: Callable) -> Callable:
    @functools.wraps(check)
    def checked(func: Callable, inputs, *args, **kwargs):
        swapped = _on_values(func, inputs)
        if swapped is None:
            return check(func, inputs, *args, **kwargs)
        kwargs.pop("masked", None)         # the pattern's gradient is what is checked
        return check(swapped[0], swapped[1], *args, **kwargs)
    checked._scorch_wrapped = check
    return checked


def install() -> None:
    for name in ("gradcheck", "gradgradcheck"):
        current = getattr(torch.autograd, name)
        if not hasattr(current, "_scorch_wrapped"):
            setattr(torch.autograd, name, _wrapping(current))
