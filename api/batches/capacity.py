"""How many rows of batch lines may be in flight, and how they are shared: the capacity rule (the
fleet's slots less the interactive reserve) and the weighted round-robin split of what is free
between API keys and their batches (docs/batches.md, "The feeder, and fair sharing"). Counted in
rows, as a worker's slots are: a line of n samples (or best_of) costs n (shared/batches.py,
entry_rows). Pure arithmetic: the feeder (api/batches/feeder.py) reads the inputs from Redis and
applies the result (api/batches/window.py spends a share in rows)."""

from __future__ import annotations

import math


def fair_shares(
    demands: dict[str, dict[str, int]], free: int, start: int, weights: dict[str, int] | None = None
) -> dict[str, int]:
    """Split `free` rows between owners {owner: {batch id: rows wanted}}: in each round an owner
    gets as many rows as its weight (1 unless `weights` names it), owners in sorted order from
    `start`, and an owner's rows go round-robin over its batches. So keys share by weight
    whatever their number of batches, lines or samples per line, and what one key cannot use goes
    to the others."""
    owners = sorted(demands)
    if not owners:
        return {}
    owners = owners[start % len(owners) :] + owners[: start % len(owners)]
    wants = {owner: dict(demands[owner]) for owner in owners}
    turn = dict.fromkeys(owners, 0)
    shares: dict[str, int] = {}
    while free > 0 and any(sum(w.values()) for w in wants.values()):
        for owner in owners:
            for _ in range((weights or {}).get(owner, 1)):
                open_batches = sorted(b for b, want in wants[owner].items() if want > 0)
                if not open_batches or free == 0:
                    break
                batch = open_batches[turn[owner] % len(open_batches)]
                turn[owner] += 1
                wants[owner][batch] -= 1
                shares[batch] = shares.get(batch, 0) + 1
                free -= 1
    return shares


def batch_capacity(fleet_slots: int, reserve: float, max_inflight: int) -> int:
    """Rows all batches' lines may have in flight: the fleet's slots less the interactive reserve
    (rounded up), at least one while any worker is live, at most max_inflight. No live worker:
    none (lines fed then would only wait in the queue, ahead of the fleet's return)."""
    if fleet_slots <= 0:
        return 0
    return min(max_inflight, max(1, fleet_slots - math.ceil(fleet_slots * reserve)))
