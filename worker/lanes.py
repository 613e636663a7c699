"""Floor shares: the places of each batch kept for the lanes below the first, so none starves.

A batch is filled from the lanes in order (common/contracts/priority.py: high, normal,
low, then bulk items), but each lane below high is owed a floor share of the
places while it has work waiting:

    normal  NORMAL_FLOOR of every batch     low  LOW_FLOOR     bulk  FUNNEL_BULK_SHARE

however busy the lanes above it are. Shares are kept as credit across batches,
so small batches honour them too: with batches of one, low is owed one batch
in ten. A lane's credit grows by its share of each batch, up to one batch's
share (rounded up to whole places, so credit saved while a lane is empty
never lets it jump a whole batch ahead), and spends what the lane takes. Places a lane
does not use are the others' again, in order (common/link/lua/take.lua).

Places count items, and a job holds a request's items: a lane whose last job
overran its places goes into debt, down to one batch, and is kept no places
until its share has paid it back, so lanes of large jobs keep their shares.
"""

from __future__ import annotations

import math

NORMAL_FLOOR = 0.2
LOW_FLOOR = 0.1


class Shares:
    def __init__(self, floors: list[float]):
        """floors: each lane's share of a batch, in the order served (the first lane's is unused)."""
        self.floors = floors
        self.credit = [0.0] * len(floors)

    def reserve(self, batch_size: int) -> list[int]:
        """The places kept for each lane in this batch."""
        places = []
        for i, floor in enumerate(self.floors):
            owed = floor * batch_size
            self.credit[i] = min(self.credit[i] + owed, math.ceil(owed)) if floor > 0 else 0.0
            places.append(max(0, min(batch_size, math.floor(self.credit[i] + 1e-9))))
        return places

    def spend(self, taken: list[int], batch_size: int) -> None:
        """What each lane took in the batch of batch_size just filled (items)."""
        for i, count in enumerate(taken):
            self.credit[i] = max(-batch_size, self.credit[i] - count)
