"""Which weights each GEMV of a frame asks L2 to fetch ahead of their use (q3t_gemv's prefetch list).

Why: at batch 1 a frame is ~430 matrix-vector products in a chain; each reads 4-50 MB of weights
that nothing else needs, so each kernel waits for HBM latency before its bytes arrive and the
next one cannot start its own reads until it is resident. Measured on the H200 the decode
loop's GEMVs reach 1.0-2.6 TB/s of the 4.2 TB/s the copy engine gets. Weights never change and
the order of the frame's launches is fixed, so the weight stream of a frame is known in advance:
each GEMV issues L2 prefetches for the bytes `ahead` bytes past its own, and the HBM stream runs
that far ahead of the kernels, which then find their weights in L2.

The stream is every GEMV's weight matrix in launch order, repeating frame after frame. Launch i
reads stream bytes [s_i, e_i); it prefetches [e_{i-1} + ahead, e_i + ahead), i.e. it moves the
prefetch frontier by exactly as many bytes as it reads, keeping it `ahead` past its own end, and
it never prefetches its own matrix (which it is already reading). `ahead` should leave room in
L2 for the matrices in use: the backend's default is half the L2 size.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

Range = tuple[int, int]  # (device address, bytes)


def l2_prefetch_plan(uses: list[Range], ahead: int) -> list[list[Range]]:
    """uses[i]: the (address, bytes) of the weights launch i of one frame reads, in launch order.
    Returns, per launch, the (address, bytes) ranges it prefetches; empty lists when ahead <= 0."""
    sizes = [n for _, n in uses]
    total = sum(sizes)
    # Past total - the largest matrix the frontier would reach into a launch's own matrix of the
    # next frame (which it skips): a distance of a whole frame or more is that distance.
    ahead = min(ahead, total - max(sizes, default=0))
    if ahead <= 0:
        return [[] for _ in uses]
    ends = list(accumulate(sizes))
    plan: list[list[Range]] = []
    for i, size in enumerate(sizes):
        lo = max(ends[i] - size + ahead, ends[i])  # never before its own end
        hi = ends[i] + ahead
        plan.append(_pieces(uses, ends, total, lo, hi, skip=i))
    return plan


def _pieces(uses: list[Range], ends: list[int], total: int, lo: int, hi: int, skip: int) -> list[Range]:
    """The stream bytes [lo, hi) (positions modulo total) as (address, bytes) pieces, without use `skip`."""
    out: list[Range] = []
    pos = lo
    while pos < hi:
        p = pos % total
        j = bisect_right(ends, p)  # the use whose bytes hold stream position p
        start = ends[j] - uses[j][1]
        take = min(ends[j] - p, hi - pos)
        if j != skip and take > 0:
            addr = uses[j][0] + (p - start)
            if out and out[-1][0] + out[-1][1] == addr:  # contiguous in memory: one range
                out[-1] = (out[-1][0], out[-1][1] + take)
            else:
                out.append((addr, take))
        pos += take
    return out
