// CUDA kernels of linear_scan:  h[t] = a[t] * h[t-1] + b[t],  h[-1] = h0.
//
// Everything is a scan of affine pairs p = (a, b) under the NON-commutative combine
//     combine(earlier=(a1, b1), later=(a2, b2)) = (a2 * a1, a2 * b1 + b2).
// h0 enters as a virtual tile before the first one with the pair (1, h0), so that
// h[t] = (prefix through t).b and a_prod[t] = (prefix through t).a.
//
// Layouts. The array is (outer, L, inner), row-major.
//  * contiguous (inner == 1): a "chain" is one row; a tile is THREADS*ITEMS consecutive
//    elements of one row; chain = tile_id % nchains, chunk = tile_id / nchains.
//  * strided (inner > 1): a chain is (o, channel tile of CW channels); a tile is CW
//    channels x LC steps of the scanned axis; every channel has its own carry.
//  Tile ids are chunk-major, so the predecessor of tile id is id - nchains.
//
// Determinism. Every carry is defined as the LEFT FOLD
//     inc[k] = combine(inc[k-1], agg[k]),  inc[-1] = (1, h0),
// and the look-back reproduces exactly that fold: it finds the nearest predecessor j
// whose inclusive prefix is published, then folds the aggregates j+1..k-1 one by one,
// in order (a published inclusive prefix met on the way is, bit for bit, the value the
// fold would produce, so it may replace the running value). The combine uses explicit
// round-to-nearest intrinsics (no contraction that could differ between call sites),
// so the result does not depend on the timing of other blocks.
//
// Status words (look-back). For float state the flag and the pair fit one aligned
// 16-byte word {flag, 0, a, b}: published with one st.relaxed.gpu.v4 and read with one
// ld.relaxed.gpu.v4, the same single-transaction assumption CUB makes for its 16-byte
// status+value words. For double and complex64 state the pair is 16 bytes alone, so the
// protocol is split (see Status<S, false> in scan_lookback.cuh): the pair is written to a slot that is
// never overwritten (aggregate and inclusive have separate slots), then the flag is
// published with st.release.gpu; the reader loads the flag with ld.acquire.gpu and only
// then reads the slot that flag names (ld.cg, L2), so it never sees a torn or stale pair.
//
// Indexing is 64-bit everywhere an element offset is formed; tile ids are 32-bit (the
// host refuses more than 2^31 tiles).
//
// The layers, each a header (CUB's thread / warp / block / agent layering, roughly):
//   scan_common.cuh        the pair, its combine, element types, kernel parameters
//   scan_lookback.cuh      status words and the predecessor walks
//   scan_block.cuh         a tile's loads, stores, warp / block scans and look-back
//   scan_tile_kernels.cuh  register tiles: lookback_serial / _warp / _regs, three_pass, strided
//   scan_tree_kernels.cuh  blelloch, hillis_steele and the three-pass middle pass
//   scan_rounds_kernel.cuh row_rounds (kernel and launcher)
//   scan_walk_kernels.cuh  row_walk, strided_walk
//   scan_stage_kernels.cuh row_stage, strided_stage (and strided_stage's launcher)
//   strided_pipe.cuh, row_pipe.cuh  the warp-specialised pipelines (kernel and launcher)
//   scan_whole_kernel.cuh  strided_whole: short strided axes, one block per channel tile (no look-back)
//   scan_launch.cuh        host helpers of every launcher
//   scan_plan.cuh          the tunings, the plan, the launches, JSS_DEFINE_DTYPE
#pragma once

#include "scan_plan.cuh"
