"""The L2 prefetch plan of a frame's GEMVs (wyoming_qwen3tts/backends/l2_prefetch.py): pure
arithmetic on (address, bytes) lists, checked byte by byte against a direct model of the stream."""

from __future__ import annotations

import random

import pytest

from wyoming_qwen3tts.backends.l2_prefetch import l2_prefetch_plan


def _bytes(ranges: list[tuple[int, int]]) -> list[int]:
    return [a + i for a, n in ranges for i in range(n)]


def _expected(uses: list[tuple[int, int]], ahead: int) -> list[list[int]]:
    """Per launch, the addresses it should prefetch, from the stream written out byte by byte."""
    stream = [(j, a + i) for j, (a, n) in enumerate(uses) for i in range(n)]
    total = len(stream)
    ahead = min(ahead, total - max(n for _, n in uses))
    if ahead <= 0:
        return [[] for _ in uses]
    out, end = [], 0
    for i, (_, n) in enumerate(uses):
        end += n
        window = [stream[p % total] for p in range(max(end - n + ahead, end), end + ahead)]
        out.append([addr for j, addr in window if j != i])
    return out


# Separate buffers, a matrix used twice in a frame (the CodePredictor's layers run 16 times),
# back-to-back buffers (merged into one range), and a matrix bigger than the distance.
USES = [(1000, 40), (5000, 10), (1000, 40), (6000, 25), (6025, 5), (9000, 120), (20000, 8)]


@pytest.mark.parametrize("ahead", [1, 7, 30, 64, 119, 200, 10**9])
def test_plan_matches_the_byte_stream(ahead: int) -> None:
    plan = l2_prefetch_plan(USES, ahead)
    assert len(plan) == len(USES)
    for got, want in zip(plan, _expected(USES, ahead)):
        assert _bytes(got) == want
        assert all(n > 0 for _, n in got)


def test_each_launch_moves_the_frontier_by_its_own_bytes_and_never_fetches_itself() -> None:
    rng = random.Random(3)
    uses, at = [], 0
    for _ in range(40):  # disjoint matrices with gaps between them
        n = rng.randrange(1, 5000)
        at += rng.randrange(1, 9) * 256
        uses.append((at, n))
        at += n
    ahead = 30000
    plan = l2_prefetch_plan(uses, ahead)
    total = 0
    for (addr, n), ranges in zip(uses, plan):
        fetched = sum(b for _, b in ranges)
        assert fetched <= n  # at most what it reads itself
        assert not any(a < addr + n and addr < a + b for a, b in ranges)  # disjoint from its own matrix
        assert all(any(u <= a and a + b <= u + m for u, m in uses) for a, b in ranges)  # inside one matrix
        total += fetched
    # Over a frame the frontier goes once round the stream: every byte is fetched once, except the
    # bytes of a matrix that its own launch would have fetched (it is reading them already).
    assert total <= sum(n for _, n in uses)
    assert total >= sum(n for _, n in uses) - sum(max(0, n - ahead) for _, n in uses)


def test_no_plan_without_distance_or_stream() -> None:
    assert l2_prefetch_plan(USES, 0) == [[] for _ in USES]
    assert l2_prefetch_plan([], 100) == []
    assert l2_prefetch_plan([(4096, 100)], 100) == [[]]  # one matrix: nothing else to fetch
