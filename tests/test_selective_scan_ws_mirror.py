"""CPU mirror of the warp-specialised CUDA forward's schedule and index maps
(cuda/selective_scan_ws.cuh), so that its hand-offs are checked without a GPU.

The schedule: the producers' and the walkers' programs as the kernel writes them (raw slots
filled by cp.async commit groups, staged into double-buffered X/BC, walked into Y, written out),
run under random interleavings with the named barriers' semantics (an arrive never blocks; a
sync waits for the matching arrive; arriving twice before the other side has synced would mix
barrier generations) and cp.async groups that land late, in order, at the latest at the
wait_group that needs them. Every access checks that the buffer holds the tile it expects, that
nothing is overwritten before its last reader is done, and that no barrier generation is mixed.
Deliberately broken variants of the schedule (a wrong X buffer, a wrong raw slot, a wait_group
one too lax, a missing DONE sync, a reused FULL barrier) are caught first. Also mirrored: the
shared-memory layout (bf16), the producers' 16-byte load map, the staging and write-out maps
(each element exactly once) and the write-out's slot order in reverse. Runs in CI without a GPU.
"""
from __future__ import annotations

import random

import pytest

ST, ROWS, RAW, NPROD = 32, 32, 3, 64  # kST, kSRows, kWsRaw, kWsProducers


def producer(ke, bug=None):
    """The producers' program: a list of (op, args)."""
    ev = []
    for s in range(RAW):
        if s < ke:
            ev.append(("issue", s, s))
        ev.append(("commit",))
    ev += [("wait", RAW - 1), ("stage", 0, 0, 0), ("arrive", "full", 0)]
    for k in range(ke):
        j, s = k & 1, k % RAW
        if k + 1 < ke:
            xb = j if bug == "x_buffer" else 1 - j
            ev += [("wait", RAW - 1 if bug == "lax_wait" else RAW - 2), ("stage", k + 1, xb, (k + 1) % RAW),
                   ("arrive", "full", 0 if bug == "one_full" else 1 - j)]
        if bug != "no_done":
            ev.append(("sync", "done", j))
        ev.append(("write_out", k, j, s))
        if k + RAW < ke:
            ev.append(("issue", k + RAW, (k + 1) % RAW if bug == "raw_slot" else s))
        ev.append(("commit",))
    ev.append(("wait", 0))
    return ev


def walker(ke, bug=None):
    ev = []
    for k in range(ke):
        j = k & 1
        ev += [("sync", "full", 0 if bug == "one_full" else j), ("walk_begin", k, j), ("walk_end", k, j),
               ("arrive", "done", j)]
    return ev


class Hazard(AssertionError):
    pass


def run(ke, bug=None, seed=0):
    """One random interleaving; raises Hazard on any broken rule."""
    rnd = random.Random(seed)
    prog = {"P": producer(ke, bug), "W": walker(ke, bug)}
    pc = {"P": 0, "W": 0}
    arrives = {("full", 0): 0, ("full", 1): 0, ("done", 0): 0, ("done", 1): 0}
    syncs = dict.fromkeys(arrives, 0)
    X = [None, None]          # tile staged in X/BC[b]
    walking = [None, None]    # tile being walked from X[b] (into Y[b])
    Y = [None, None]          # tile whose y sums Y[b] holds, written-out flag
    Y_out = [True, True]
    raw = [None] * RAW        # (tile, landed)
    raw_free = [True] * RAW
    groups = []               # commit groups in order: lists of (tile, slot)
    open_group = []

    def land(n_keep):
        while len(groups) > n_keep:
            for t, s in groups.pop(0):
                raw[s] = (t, True)

    def step(role):
        op = prog[role][pc[role]]
        kind = op[0]
        if kind == "sync":
            key = (op[1], op[2])
            if arrives[key] <= syncs[key]:
                return False  # blocked until the matching arrive
            syncs[key] += 1
        elif kind == "arrive":
            key = (op[1], op[2])
            if arrives[key] > syncs[key]:
                raise Hazard(f"{key}: second arrive before the first generation completed")
            arrives[key] += 1
        elif kind == "issue":
            t, s = op[1], op[2]
            if not raw_free[s]:
                raise Hazard(f"raw slot {s} refilled (tile {t}) while tile {raw[s][0]} is still needed")
            raw[s], raw_free[s] = (t, False), False
            open_group.append((t, s))
        elif kind == "commit":
            groups.append(list(open_group))
            open_group.clear()
        elif kind == "wait":
            land(op[1])
        elif kind == "stage":
            t, xb, s = op[1], op[2], op[3]
            if raw[s] != (t, True):
                raise Hazard(f"staging tile {t} from raw slot {s} holding {raw[s]}")
            if walking[xb] is not None or (X[xb] is not None and X[xb] != "walked"):
                raise Hazard(f"staging tile {t} into X[{xb}] before tile {X[xb]} was walked")
            X[xb] = t
        elif kind == "walk_begin":
            k, j = op[1], op[2]
            if X[j] != k:
                raise Hazard(f"walking tile {k} from X[{j}] holding {X[j]}")
            if not Y_out[j]:
                raise Hazard(f"tile {k}'s y into Y[{j}] before tile {Y[j]} was written out")
            walking[j] = k
        elif kind == "walk_end":
            k, j = op[1], op[2]
            walking[j], X[j], Y[j], Y_out[j] = None, "walked", k, False
        elif kind == "write_out":
            k, j, s = op[1], op[2], op[3]
            if Y[j] != k or walking[j] is not None:
                raise Hazard(f"writing out tile {k} from Y[{j}] holding {Y[j]} (walk in progress: {walking[j]})")
            if raw[s] != (k, True):
                raise Hazard(f"writing out tile {k} with raw slot {s} holding {raw[s]}")
            Y_out[j], raw_free[s] = True, True
        pc[role] += 1
        return True

    while pc["P"] < len(prog["P"]) or pc["W"] < len(prog["W"]):
        if groups and rnd.random() < 0.2:  # the oldest commit group lands late
            land(len(groups) - 1)
        live = [r for r in "PW" if pc[r] < len(prog[r])]
        rnd.shuffle(live)
        if not any(step(r) for r in live):
            raise Hazard("deadlock")
    if Y_out != [True, True] or any(not f for f in raw_free[: min(ke, RAW)]):
        raise Hazard("a tile was never written out")


@pytest.mark.parametrize("ke", [1, 2, 3, 4, 9, 64])
def test_schedule_has_no_hazard(ke):
    for seed in range(60):
        run(ke, seed=seed)


@pytest.mark.parametrize("bug", ["x_buffer", "raw_slot", "lax_wait", "no_done", "one_full"])
def test_broken_schedules_are_caught(bug):
    with pytest.raises(Hazard):
        for seed in range(200):
            run(9, bug, seed)


# --- index maps (bf16: 16-byte chunks of 8 elements) ---
EPC, CPR = 8, ST // 8
RS = ST * 2 + 16                       # raw row stride, bytes
RAW_ROWS = 3 * ROWS + 2 * 16           # u, delta, z rows; B, C states
X_BYTES, BC_BYTES, Y_BYTES = ROWS * (ST + 1) * 8, ST * 16 * 8, ROWS * 36 * 4


def test_layout_fits_three_blocks():
    total = 2 * X_BYTES + 2 * BC_BYTES + 2 * Y_BYTES + RAW * RAW_ROWS * RS + 2 * ROWS * 4
    assert total == 65280
    assert 3 * (total + 1024) <= 228 * 1024  # 1 KiB an SM block is the driver's
    assert RS % 16 == 0 and X_BYTES % 16 == 0 and BC_BYTES % 16 == 0 and Y_BYTES % 16 == 0


def test_load_map_covers_each_chunk_once():
    seen = set()
    for pt in range(NPROD):
        for m in range(RAW_ROWS * CPR // NPROD):
            c = pt + m * NPROD
            rr, col = c // CPR, c % CPR
            dst = rr * RS + col * 16
            assert dst % 16 == 0 and col * 16 + 16 <= ST * 2
            seen.add((rr, col))
    assert seen == {(r, c) for r in range(RAW_ROWS) for c in range(CPR)}


def test_staging_and_write_out_maps_cover_each_element_once():
    rows = [(pt % ROWS, (pt // ROWS) * 16 + e) for pt in range(NPROD) for e in range(16)]
    assert sorted(rows) == [(r, i) for r in range(ROWS) for i in range(ST)]
    bc = [(pt % 16, (pt // 16) * 8 + e) for pt in range(NPROD) for e in range(8)]
    assert sorted(bc) == [(n, i) for n in range(16) for i in range(ST)]


@pytest.mark.parametrize("rev", [False, True])
def test_write_out_reads_the_walks_slots(rev):
    # Y + (REV ? kST - 16 - i0 : i0), element yv[REV ? 15 - e : e] for position i0 + e.
    for i0 in (0, 16):
        base = ST - 16 - i0 if rev else i0
        for e in range(16):
            slot = base + (15 - e if rev else e)
            assert slot == (ST - 1 - (i0 + e) if rev else i0 + e)
