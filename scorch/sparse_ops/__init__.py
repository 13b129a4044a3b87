"""The torch functions scorch runs on sparse operands, one module per op family. Importing
the package registers every handler with ``scorch._dispatch``."""
from . import accessors, einsum, shape, elementwise, matmul, sparse_linear, reductions, nonlinear, comparison, dropout, products, composites, dense_by_nature, order_statistics, positions, in_place, item_writes, value_ops, summaries, layout_ops, slice_ops, special_functions, variants, slice_writes, windows, pool_indices, grid_sampling, aliases, low_rank, protocol, recurrent, stored_zeros  # noqa: F401,E501  (registration)
