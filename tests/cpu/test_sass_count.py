"""aot/tools/sass_count.py's walk of a loop whose steps are uniform branches, on a hand-written
SASS listing shaped as router_select's key-tile loop (a barrier, then a fold step per log2 n and a branch on
n_k != 1): the count
follows the pair, and a kernel with no such branch runs its loop straight through."""

from __future__ import annotations

from aot.tools.sass_count import loop_trace, parse

SASS = """
        /*0000*/                   POPC R69, UR15 ;
.L_x_1:
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0020*/                   HMMA.16816.F32.BF16 R8, R16, R86, R8 ;
        /*0030*/                   ISETP.GE.U32.AND P1, PT, R69, 0x2, PT ;
        /*0040*/                   ISETP.GE.U32.AND P0, PT, R69, 0x3, PT ;
        /*0050*/              @!P1 BRA `(.L_x_6) ;
        /*0060*/                   SHFL.BFLY PT, R65, R64, 0x8, 0x1f ;
        /*0070*/                   FMNMX R64, R64, R65, !PT ;
.L_x_6:
        /*0080*/              @!P0 BRA `(.L_x_7) ;
        /*0090*/                   SHFL.BFLY PT, R65, R64, 0x10, 0x1f ;
        /*00a0*/                   FMNMX R64, R64, R65, !PT ;
.L_x_7:
        /*00b0*/                   PLOP3.LUT P0, PT, PT, PT, UP1, 0x80, 0x0 ;
        /*00c0*/               @P0 BRA `(.L_x_8) ;
        /*00d0*/                   STG.E desc[UR10][R64.64+0x4], R89 ;
.L_x_8:
        /*00e0*/                   ISETP.LE.AND P0, PT, R0, UR12, PT ;
        /*00f0*/              @!P0 BRA `(.L_x_1) ;
        /*0100*/                   EXIT ;
"""


def test_the_walk_follows_the_uniform_branches():
    ins, labels = parse(SASS)
    assert len(ins) == 17 and labels[".L_x_1"] == 1  # the loop: its barrier, then the counted body
    # log2 n_q = 2: one fold step (2 instructions) runs, the second is branched over; n_k != 1
    count, ops, size, unknown = loop_trace(ins, labels, {"R69": 2}, {"UP1": True})
    assert size == 13 and count == 10 and ops["SHFL"] == 1 and ops["STG"] == 0 and unknown == []
    # log2 n_q = 3 and n_k = 1: both steps and the second block's store
    count, ops, _, _ = loop_trace(ins, labels, {"R69": 3}, {"UP1": False})
    assert count == 13 and ops["SHFL"] == 2 and ops["STG"] == 1
    # nothing known: every branch is reported and counted as not taken (the whole body)
    count, _, _, unknown = loop_trace(ins, labels, {}, {})
    assert count == 13 and len(unknown) == 3


# router_select's current loop: the counted body begins after the second of two barriers (the
# staged tile is complete), tests n - 1 against zero and a key block's first cell by a mask, and
# keeps a predicate across a stretch in a register (P2R, then ISETP.NE against RZ)
SASS2 = """
.L_x_1:
        /*0000*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0010*/                   LDS R4, [R3] ;
        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0030*/                   LDSM.16.M88.4 R8, [R0+0x4400] ;
        /*0040*/                   ISETP.NE.U32.AND P3, PT, R69, RZ, PT ;
        /*0050*/                   P2R R17, PR, RZ, 0x8 ;
        /*0060*/                   ISETP.GE.AND P3, PT, R5, UR4, PT ;
        /*0070*/                   ISETP.NE.AND P3, PT, R17, RZ, PT ;
        /*0080*/              @!P3 BRA `(.L_x_2) ;
        /*0090*/                   SHFL.BFLY PT, R65, R64, 0x4, 0x1f ;
.L_x_2:
        /*00a0*/                   LOP3.LUT P0, RZ, R69, 0x2, RZ, 0xc0, !PT ;
        /*00b0*/               @P0 BRA `(.L_x_3) ;
        /*00c0*/                   STG.E desc[UR10][R64.64+0x4], R89 ;
.L_x_3:
        /*00d0*/                   ISETP.NE.U32.AND P0, PT, R117, R114, PT ;
        /*00e0*/              @!P0 BRA `(.L_x_4) ;
        /*00f0*/                   BRA `(.L_x_1) ;
.L_x_4:
        /*0100*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0110*/                   EXIT ;
"""


def test_the_walk_starts_after_the_chosen_barrier_and_follows_saved_predicates():
    ins, labels = parse(SASS2)
    # n_k = 4 (R69 = n_k - 1 = 3): the shuffle runs (n_k != 1, kept through R17); cell 2 is not a
    # block's first (3 & 2 != 0): its store is branched over; the loop's exit test is unknown
    count, ops, size, unknown = loop_trace(ins, labels, {"R69": 3}, {}, bar=-2)
    assert size == 12 and ops["LDSM"] == 1 and ops["LDS"] == 0
    assert ops["SHFL"] == 1 and ops["STG"] == 0 and count == 11
    assert unknown == ["@!P0 BRA `(.L_x_4)"]
    # n_k = 1: no shuffle, and every cell is a block's first: the store runs
    count, ops, _, _ = loop_trace(ins, labels, {"R69": 0}, {}, bar=-2)
    assert ops["SHFL"] == 0 and ops["STG"] == 1 and count == 11
