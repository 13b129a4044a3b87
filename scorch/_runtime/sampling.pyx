# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The corners of grid sampling (``F.grid_sample``): for each output point, the input
positions its value reads and their weights, in one pass over the grid.

Why: written as torch ops (unnormalize, reflect or clip, floor, one pass per corner and
dimension for positions, weights and the inside test, then ``nonzero`` and gathers) the
sampling matrix of a 4 x 256 x 256 grid took ~30 passes and 58 ms, 9x torch's whole dense
``grid_sample``. Here each point is read once and its corners written straight out.

The arithmetic is torch's (``GridSampler.h``: ``grid_sampler_compute_source_index``), in
the grid's own precision: unnormalize, reflect (``reflect_coordinates``) and clip for the
padding mode, then the ``2**n`` corners around the source point (bilinear, weights the
products of the per-dimension distances) or the one it rounds to (nearest, halves to
even). A corner outside the input is left out (zeros padding; the other modes clip first).
"""
from libc.math cimport floor, fabs, fmod, nearbyint
from libc.stdint cimport int64_t

import torch

ctypedef fused real_t:
    float
    double

__all__ = ["sampling_corners"]

cdef int MAX_DIMS = 3


# The constants are typed: Cython writes a literal ``1`` next to a float as ``1.0``, a
# double, and the float32 arithmetic would then run in double (weights 1e-7 off torch's).

cdef inline real_t _unnormalize(real_t c, int64_t size, bint align) noexcept nogil:
    cdef real_t one = 1, two = 2
    if align:
        return (c + one) / two * <real_t>(size - 1)
    return ((c + one) * <real_t>size - one) / two


cdef inline real_t _reflect(real_t x, int64_t twice_low, int64_t twice_high) noexcept nogil:
    """torch's ``reflect_coordinates``."""
    if twice_low == twice_high:
        return 0
    cdef real_t two = 2
    cdef real_t low = <real_t>twice_low / two
    cdef real_t span = <real_t>(twice_high - twice_low) / two
    x = fabs(x - low)
    cdef real_t extra = fmod(x, span)
    cdef int64_t flips = <int64_t>floor(x / span)
    if flips % 2 == 0:
        return extra + low
    return span - extra + low


cdef inline real_t _source(real_t c, int64_t size, int padding, bint align) noexcept nogil:
    cdef real_t x = _unnormalize(c, size, align)
    if padding == 2:
        if align:
            x = _reflect(x, 0, 2 * (size - 1))
        else:
            x = _reflect(x, -1, 2 * size - 1)
    if padding == 1 or padding == 2:
        if x != x:          # a NaN coordinate (or an infinite one reflected): torch's index 0
            x = 0
        elif x < 0:
            x = 0
        elif x > size - 1:
            x = size - 1
    return x


cdef int64_t _corners(const real_t* g, int64_t batch, int64_t points, int n, const int64_t* sizes,
                      int mode, int padding, bint align, int64_t* key, int64_t* pos,
                      real_t* weight) noexcept nogil:
    """Fills key (batch * plane + input position), pos (output point) and weight for every
    kept corner, in (batch, point, corner) order; returns their count."""
    cdef int64_t plane = 1, b, p, q, at, count = 0
    cdef int d, k, picks = (1 << n) if mode == 0 else 1
    cdef real_t s, w, one = 1
    cdef real_t lo[3]
    cdef real_t src[3]
    cdef bint inside
    for d in range(n):
        plane *= sizes[d]
    for b in range(batch):
        for p in range(points):
            for d in range(n):   # grid's last dim is x, y(, z): dim d of the input reads n - 1 - d
                s = _source(g[(b * points + p) * n + (n - 1 - d)], sizes[d], padding, align)
                src[d] = s
                lo[d] = floor(s) if mode == 0 else nearbyint(s)
            for k in range(picks):
                q = 0
                w = one
                inside = True
                for d in range(n):
                    if mode == 0 and (k >> (n - 1 - d)) & 1:   # the upper corner: s - lo
                        s = lo[d] + one
                        w = w * (src[d] - lo[d])
                    else:                                        # the lower: lo + 1 - s
                        s = lo[d]
                        if mode == 0:
                            w = w * (lo[d] + one - src[d])
                    if not (s >= 0 and s <= sizes[d] - 1):   # NaN too
                        inside = False
                        break
                    at = <int64_t>s
                    q = q * sizes[d] + at
                if inside:
                    key[count] = b * plane + q
                    pos[count] = p
                    weight[count] = w
                    count += 1
    return count


def sampling_corners(grid, sizes, int mode, int padding, bint align_corners):
    """(key, point, weight) of every corner inside the input, in (batch, point, corner)
    order: ``key`` = batch * prod(sizes) + the corner's input position (row-major over
    ``sizes``), ``point`` the output point (row-major over the grid's spatial dims),
    ``weight`` in the grid's dtype. ``grid``: (batch, *points, n), float32 or float64;
    ``mode``: 0 bilinear, 1 nearest; ``padding``: 0 zeros, 1 border, 2 reflection."""
    cdef int n = len(sizes)
    if n < 1 or n > MAX_DIMS or grid.dim() < 2 or grid.shape[grid.dim() - 1] != n:
        raise ValueError(f"grid's last dimension must be {n} (1-3 spatial dims), got {tuple(grid.shape)}")
    if grid.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"grid must be float32 or float64, got {grid.dtype}")
    g = grid.contiguous()
    cdef int64_t batch = g.shape[0]
    cdef int64_t points = g.numel() // max(1, batch * n)
    cdef int picks = (1 << n) if mode == 0 else 1
    cdef int64_t cap = batch * points * picks
    cdef int64_t sz[3]
    cdef int d
    for d in range(n):
        sz[d] = int(sizes[d])
    key = torch.empty(cap, dtype=torch.int64)
    pos = torch.empty(cap, dtype=torch.int64)
    weight = torch.empty(cap, dtype=g.dtype)
    cdef int64_t* kp = <int64_t*><size_t>key.data_ptr()
    cdef int64_t* pp = <int64_t*><size_t>pos.data_ptr()
    cdef size_t gp = g.data_ptr(), wp = weight.data_ptr()
    cdef int64_t count
    if g.dtype == torch.float32:
        with nogil:
            count = _corners(<const float*>gp, batch, points, n, sz, mode, padding, align_corners,
                             kp, pp, <float*>wp)
    else:
        with nogil:
            count = _corners(<const double*>gp, batch, points, n, sz, mode, padding, align_corners,
                             kp, pp, <double*>wp)
    return key[:count], pos[:count], weight[:count]
