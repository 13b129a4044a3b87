"""Concrete index notation (TACO's CIN): foralls, ``where`` for workspaces, assignments.

``from_schedule`` builds the statement a schedule stands for; ``str()`` prints it, e.g.
Gustavson SpGEMM with a sparse output::

    forall i
      where
        forall k
          out(i,k) = w(k)
        forall j
          forall k
            w(k) += T0(i,j) * T1(j,k)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Union

__all__ = ["Forall", "Where", "Assign", "Stmt", "from_schedule"]


@dataclass(frozen=True)
class Assign:
    lhs: str
    op: str          # "=" or "+="
    rhs: str

    def lines(self, ind: int) -> List[str]:
        return ["  " * ind + f"{self.lhs} {self.op} {self.rhs}"]


@dataclass(frozen=True)
class Forall:
    var: str
    body: "Stmt"

    def lines(self, ind: int) -> List[str]:
        return ["  " * ind + f"forall {self.var}"] + self.body.lines(ind + 1)


@dataclass(frozen=True)
class Where:
    consumer: "Stmt"
    producer: "Stmt"

    def lines(self, ind: int) -> List[str]:
        return ["  " * ind + "where"] + self.consumer.lines(ind + 1) + self.producer.lines(ind + 1)


Stmt = Union[Assign, Forall, Where]


def _nest(vars_: Sequence[str], body: Stmt) -> Stmt:
    for v in reversed(list(vars_)):
        body = Forall(v, body)
    return body


def _str(self) -> str:
    return "\n".join(self.lines(0))


for _cls in (Assign, Forall, Where):
    _cls.__str__ = _str


def from_schedule(s) -> Stmt:
    """The concrete index notation of a :class:`~scorch.tensor_compiler.schedule.Schedule`."""
    asg, out, order = s.assignment, s.output, s.loop_order
    lhs = f"out({','.join(asg.output)})"
    rhs = str(asg.rhs)
    red = bool(asg.reduction)
    if out.mode == "ws":
        d = out.ws_depth
        w = f"w({','.join(out.ws_vars)})"
        consumer = _nest(out.ws_vars, Assign(lhs, "=", w))
        producer = _nest(order[d:], Assign(w, "+=", rhs))
        return _nest(order[:d], Where(consumer, producer))
    if out.mode == "acc":
        d = out.acc_depth
        return _nest(order[:d], Where(Assign(lhs, "=", "t"), _nest(order[d:], Assign("t", "+=", rhs))))
    return _nest(order, Assign(lhs, "+=" if red else "=", rhs))
