"""The SASS scoreboard check of cuda/tools/sass_scoreboards.py, on hand-made listings: a walk
instruction waiting on the scoreboard that the loop's prefetch (a global load) set is reported;
one waiting on another scoreboard, or on one the loop waited for before the barrier, is not."""
import importlib.util
import pathlib

_TOOL = pathlib.Path(__file__).resolve().parents[1] / "cuda" / "tools" / "sass_scoreboards.py"
_spec = importlib.util.spec_from_file_location("sass_scoreboards", _TOOL)
sb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sb)


def ctrl(stall=1, wr=7, rd=7, wait=()):
    """The second 64-bit word of an instruction carrying these control bits."""
    c = stall | (wr << 5) | (rd << 8) | sum(1 << (11 + b) for b in wait)
    return c << 41


def listing(insns):
    """cuobjdump-style text for [(text, control word)], 16 bytes apart from address 0."""
    out = ["\t\tFunction : kern"]
    for i, (text, hi) in enumerate(insns):
        out.append(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x000000000000007a */")
        out.append(f"                                                  /* 0x{hi:016x} */")
    return out


def tile_loop(walk_wait, waited_before_barrier=False):
    body = [("LDG.E.64.CONSTANT R14, desc[UR18][R14.64]", ctrl(wr=5))]  # the prefetch
    if waited_before_barrier:
        body.append(("IMAD.U32 R7, R14, 0x10000, RZ", ctrl(wait=(5,))))
    body += [
        ("BAR.SYNC.DEFER_BLOCKING 0x0", ctrl()),
        ("LDS.64 R32, [R8]", ctrl(wr=4)),
        ("FFMA R28, R34, R45, R28", ctrl(wait=walk_wait)),
        ("BAR.SYNC.DEFER_BLOCKING 0x0", ctrl()),
        ("BRA 0x0", ctrl()),
    ]
    return listing(body)


def check(lines):
    insns = sb.parse(lines)["kern"]
    (_, _), bars, sbs, waits = sb.walk_waits(insns)
    return bars, sbs, [x.text for _, x in waits]


def test_control_bits_decoded():
    x = sb.parse(listing([("FFMA R1, R2, R3, R4", ctrl(stall=3, wr=2, rd=1, wait=(0, 5)))]))["kern"][0]
    assert (x.stall, x.wr_sb, x.rd_sb, x.wait) == (3, 2, 1, {0, 5})


def test_wait_on_the_prefetch_is_reported():
    bars, sbs, waits = check(tile_loop(walk_wait=(0, 5)))
    assert bars == [1, 4] and sbs == {5}
    assert waits == ["FFMA R28, R34, R45, R28"]


def test_other_scoreboards_are_not_reported():
    assert check(tile_loop(walk_wait=(4,)))[2] == []
    # the same wait on 5 once the loop has waited for its loads before the barrier
    assert check(tile_loop(walk_wait=(5,), waited_before_barrier=True))[2] == []
