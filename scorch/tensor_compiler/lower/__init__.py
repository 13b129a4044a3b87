"""Lowering: a :class:`~scorch.tensor_compiler.schedule.Schedule` (with the value and index
types) to the loop IR (:mod:`scorch.tensor_compiler.loop_ir`), which ``codegen`` prints.

The pieces, each a pure function of its inputs:

* ``facts``: the kernel-wide decisions, made before any node is built: C types, unit-stride
  accesses, the levels and loop kind of every depth, whether every output element is stored
  exactly once (assign, no memset), register rows / vector dot widths, rows assembly, the
  workspace flavour, chunking and load balancing;
* ``loops``: the loop nest (dense loops, sparse segments, coordinate runs, k-pointer merges
  from the merge lattice, chased diagonal levels);
* ``output``: the expression's value and the output modes (dense, direct, acc, workspace,
  pattern, rows assembly), register rows and vector leaves;
* ``entry``: the argument table, the chunk-function variants and the ``kernel`` entry.
"""
from .entry import kernel_args, lower_kernel
from .facts import (CTYPES, DENSE_WS_LIMIT, ITYPES, NPTYPES, SHORT_ROWS, SHORT_ROWS_BY_DTYPE,
                    kernel_facts, reads_strided, relayouts, order_relayouts, gather_relayouts, short_rows, short_rows_limit,
                    unit_stride_accesses)

__all__ = ["lower_kernel", "kernel_args", "kernel_facts", "CTYPES", "NPTYPES", "ITYPES",
           "DENSE_WS_LIMIT", "SHORT_ROWS", "SHORT_ROWS_BY_DTYPE", "short_rows", "short_rows_limit",
           "reads_strided", "relayouts", "order_relayouts", "gather_relayouts", "unit_stride_accesses"]
