"""Grouping a batch of variable-width items into runs, for a task's `buckets()` hook.

A task whose `collate` pads a batch to its widest item (texts to the longest,
text-line images to the widest) makes the model compute every padded element:
one 256-token text among 31 short ones costs as much as 32 long ones. The
worker runs each group `buckets()` returns as its own model call, so a task
can split a batch by width. `group_by_width` picks the split:

- a run of c items padded to width w costs c·w, plus `run_cost` for the run
  itself (the model's fixed cost per call, expressed in padded elements: how
  many elements the model computes in the time a call costs on top of them);
- sorted by width, the cheapest runs are contiguous, so a dynamic programme
  over the cut points finds the cheapest grouping exactly (O(m²) for m
  distinct widths);
- a uniform batch stays one run; with `run_cost` 0 every distinct width is a
  run of its own (rows then come back exactly as wide as their inputs).
"""

from __future__ import annotations

from collections.abc import Sequence


def group_by_width(widths: Sequence[int], run_cost: float) -> list[list[int]]:
    """Indexes of the items, in runs of similar width that cost the least in all, narrowest run first."""
    order = sorted(range(len(widths)), key=widths.__getitem__)
    # Runs only ever end where the width changes: work over the distinct widths, each with how many
    # items are at most that wide (ends[k]).
    distinct: list[int] = []
    ends: list[int] = []
    for count, i in enumerate(order, 1):
        if distinct and distinct[-1] == widths[i]:
            ends[-1] = count
        else:
            distinct.append(widths[i])
            ends.append(count)
    m = len(distinct)
    best = [0.0] + [float("inf")] * m  # best[j]: the cheapest runs of the items at most distinct[j-1] wide
    cut = [0] * (m + 1)  # where the last of those runs starts, in distinct widths
    for j in range(1, m + 1):
        for i in range(j):  # the last run: the items wider than distinct[i-1], padded to distinct[j-1]
            cost = best[i] + (ends[j - 1] - (ends[i - 1] if i else 0)) * distinct[j - 1] + run_cost
            if cost < best[j]:  # strictly: among equal costs, the longest last run
                best[j], cut[j] = cost, i
    runs = []
    j = m
    while j:
        i = cut[j]
        runs.append(order[ends[i - 1] if i else 0:ends[j - 1]])
        j = i
    return runs[::-1]
