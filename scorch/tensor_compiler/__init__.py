"""The Scorch compiler: any einsum (or index expression) over any mix of formats becomes one
fused, cached Cython kernel.

Stages (docs/compiler.md draws them with the data between them):

1. front end: ``index_notation`` (the IR; ``parse_einsum``), ``frontend`` (equation and size
   checks), ``rewrite`` (broadcast and blocked-format rewrites);
2. planning: ``planner`` -> ``schedule`` (``format_inference``: Algorithm 4;
   ``loop_order``: Algorithm 1 under ``cost_model``; workspaces; tiling: Algorithm 3),
   cached as ``plans.PlanEntry``; ``dense_route`` (a result of one compressed level over
   dense ones, computed dense where that pays);
3. lowering and codegen: ``codegen`` (Cython source; ``levels``, ``merge_lattice``);
4. build and cache: ``build`` (compile, disk and memory cache), ``prebuilt``, ``fastcall``;
5. run: ``operands`` (binding), ``arguments`` (argument tables), ``execute`` (general path),
   ``runner`` (warm path), ``assemble`` (sparse outputs), ``allocate``, ``relayout``,
   ``narrowed_gather`` (a re-layout narrowed to a sparse operand's columns), ``threads``,
   ``tiling``.

Entry points: :func:`einsum`, :func:`compute`, :func:`explain`, :func:`read_formats`, :func:`result_is_dense` (``api``).
"""
from .api import (_DISPATCH, compute, einsum, einsum_declined, explain, kept_assignment,  # noqa: F401
                  plan_cache_clear, plan_cache_info, read_formats, result_is_dense,
                  set_sparse_tensor_type)
from .index_notation import Access, Assignment  # noqa: F401
from .plans import COMPILER_VERSION, Plan, _fast  # noqa: F401

__all__ = ["einsum", "einsum_declined", "explain", "read_formats", "result_is_dense", "compute", "Access", "Assignment", "Plan",
           "plan_cache_clear", "plan_cache_info", "set_sparse_tensor_type", "COMPILER_VERSION"]

from .. import dynamo_rules as _dynamo_rules  # noqa: E402

_dynamo_rules.mark_package(__name__)   # torch.compile: the compiler runs eagerly, never traced into
