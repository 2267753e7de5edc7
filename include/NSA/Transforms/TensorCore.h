//===- TensorCore.h - tile contractions on tensor cores ----------*- C++
//-*-===//
//
// The part of nsa-map-to-gpu that puts tile contractions
// `C[m, n] += A[m, k] * B[n, k]` (or `B[k, n]`), bf16 x bf16 -> f32, on
// warp-level tensor cores: fragments read by nvgpu.ldmatrix, products by
// nvvm.mma.sync m16n8k16 (nvgpu.mma.sync's lowering in MLIR 22 has no bf16
// case: "failed to deduce operand PTX types").
//
//===----------------------------------------------------------------------===//

#ifndef NSA_LIB_TRANSFORMS_TENSORCORE_H
#define NSA_LIB_TRANSFORMS_TENSORCORE_H

#include "mlir/Dialect/Linalg/IR/Linalg.h"

#include <optional>

namespace mlir::nsa::detail {

/// The operands of a contraction that mma.sync.m16n8k16 can compute: static
/// bf16 A [m, k], B [n, k] or [k, n], f32 C [m, n], m % 16 = n % 8 =
/// k % 16 = 0.
struct Contraction {
  Value a, b, c;
  int64_t m, n, k;
  bool bTransposed; ///< B is stored [n][k]
};

/// Packs two bf16 scalars into one 32-bit register, `lo` in the low half.
Value packBF16(OpBuilder &b, Location loc, Value lo, Value hi);

/// Rounds two f32 to bf16 and packs them as packBF16 does, by one vector
/// truncation (a single cvt.rn.bf16x2.f32 on sm_80 and later, where the
/// scalar path takes five instructions a pair).
Value truncPackBF16(OpBuilder &b, Location loc, Value lo, Value hi);

/// The 32-bit registers of an nvgpu.ldmatrix result (vector<N x 2 x bf16>),
/// rows [first, first + count).
SmallVector<Value, 4> unpackLdMatrix(OpBuilder &b, Location loc, Value loaded,
                                     int64_t first, int64_t count);

/// One `nvvm.mma.sync` m16n8k16 (bf16 x bf16 + f32): `a` 4 registers, `b` 2,
/// `c` 4 f32; returns the 4 f32 of D.
SmallVector<Value, 4> mmaBF16(OpBuilder &b, Location loc, ValueRange a,
                              ValueRange bFrag, ValueRange c);

/// `op` (a linalg.generic on buffers) as a contraction, if it is one.
std::optional<Contraction> matchContraction(linalg::GenericOp op);

/// Replaces `op` by warp-level tensor-core code for the `blockSize` threads
/// of a block (`tid` in [0, blockSize), blockSize a multiple of 32). Each
/// warp takes 16-row strips of C, several 8-column tiles at a time whose
/// accumulators stay in registers over K. Operands in tile buffers (shared
/// memory after nsa-map-to-gpu places them) with 16-byte aligned rows are
/// read with ldmatrix; others with single loads in the fragment layout.
/// With `zeroInit` the accumulators start from zero instead of C.
void lowerToMMA(linalg::GenericOp op, const Contraction &con, Value tid,
                int64_t blockSize, bool zeroInit = false);

} // namespace mlir::nsa::detail

#endif // NSA_LIB_TRANSFORMS_TENSORCORE_H
