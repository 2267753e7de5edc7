//===- Gating.cpp - the gating kernels of the flash strategy -------------===//
//
// nsa.combine (Spec section 8) and its gradient nsa.combine_grad (section
// 9) as memory-bound kernels of nsa-flash-attention: a thread per 8
// elements (16 bytes) of one (batch, token, query head) row of Dv, the
// row's three sigmoids computed once per thread. The gradient's gate terms
// `o_b . do` are dot products over Dv, summed by the Dv / 8 threads of the
// row with xor shuffles (consecutive lanes of one warp).
//
//===----------------------------------------------------------------------===//

#include "FlashBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;

Value flash::sigmoid(Emit &e, Value g) {
  return arith::DivFOp::create(
      e.b, e.loc, e.f32(1),
      e.fadd(e.f32(1), math::ExpOp::create(
                           e.b, e.loc, arith::NegFOp::create(e.b, e.loc, g))));
}

namespace {

/// The launch of a gating kernel over the rows of `like` [B, T, HQ, Dv]:
/// 8 elements a thread, whole rows per block. Calls `body(valid, batch,
/// token, head, col)` with the thread's row clamped into range (`valid`
/// says whether it is a real one), so that every lane reaches the
/// shuffles.
gpu::LaunchOp
launchRows(Emit &e, Value like, int64_t qHeads, int64_t vDim,
           StringRef kernelName,
           function_ref<void(Value, Value, Value, Value, Value)> body) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  int64_t chunks = vDim / 8, rowsPerBlock = std::max<int64_t>(1, 256 / chunks);
  Value batches = memref::DimOp::create(b, loc, like, 0);
  Value tokens = memref::DimOp::create(b, loc, like, 1);
  Value rows = e.mul(e.mul(batches, tokens), e.idx(qHeads));
  OpBuilder::InsertionGuard guard(b);
  gpu::LaunchOp launch = createNamedLaunch(
      b, loc, {e.ceilDiv(rows, rowsPerBlock), e.idx(1), e.idx(1)},
      rowsPerBlock * chunks, 0, kernelName);
  Value tid = launch.getThreadIds().x;
  Value row = e.add(e.mul(launch.getBlockIds().x, e.idx(rowsPerBlock)),
                    e.divs(tid, e.idx(chunks)));
  Value valid = e.lt(row, rows);
  row = e.min(row, e.sub(rows, e.idx(1)));
  Value col = e.mul(e.rems(tid, e.idx(chunks)), e.idx(8));
  Value head = e.rems(row, e.idx(qHeads));
  Value bt = e.divs(row, e.idx(qHeads));
  body(valid, e.divs(bt, tokens), e.rems(bt, tokens), head, col);
  return launch;
}

/// The 8 elements of `buffer` at (batch, t, head, col..col+7) in f32.
Value loadEight(Emit &e, Value buffer, ValueRange at) {
  auto vecBF16 = VectorType::get({8}, e.b.getBF16Type());
  Value loaded =
      vector::LoadOp::create(e.b, e.loc, vecBF16, buffer, at,
                             /*nontemporal=*/false, llvm::MaybeAlign(16));
  return arith::ExtFOp::create(e.b, e.loc,
                               VectorType::get({8}, e.b.getF32Type()), loaded);
}

/// Stores the f32 vector `x` into `buffer` at `at` as 8 bf16.
void storeEight(Emit &e, Value x, Value buffer, ValueRange at) {
  auto vecBF16 = VectorType::get({8}, e.b.getBF16Type());
  vector::StoreOp::create(
      e.b, e.loc, arith::TruncFOp::create(e.b, e.loc, vecBF16, x), buffer, at,
      /*nontemporal=*/false, llvm::MaybeAlign(16));
}

} // namespace

bool mlir::nsa::detail::combineGradFits(int64_t vDim) {
  int64_t chunks = vDim / 8;
  return vDim % 8 == 0 && chunks >= 1 && chunks <= 32 &&
         (chunks & (chunks - 1)) == 0;
}

gpu::LaunchOp mlir::nsa::detail::buildCombineKernel(
    OpBuilder &b, Location loc, int64_t qHeads, int64_t vDim, Value cmp,
    Value slc, Value win, Value gates, Value out, StringRef kernelName) {
  Emit e{b, loc};
  Type f32 = b.getF32Type();
  auto vecF32 = VectorType::get({8}, f32);
  return launchRows(
      e, out, qHeads, vDim, kernelName,
      [&](Value valid, Value batch, Value t, Value head, Value col) {
        e.ifThen(valid, [&] {
          Value sum;
          Value branches[3] = {cmp, slc, win};
          for (auto [i, branch] : llvm::enumerate(branches)) {
            Value g = arith::ExtFOp::create(
                b, loc, f32,
                e.load(gates,
                       {batch, t, head, e.idx(static_cast<int64_t>(i))}));
            Value sig = sigmoid(e, g);
            Value x = loadEight(e, branch, {batch, t, head, col});
            Value term = arith::MulFOp::create(
                b, loc, vector::BroadcastOp::create(b, loc, vecF32, sig), x);
            sum = sum ? e.fadd(sum, term) : term;
          }
          storeEight(e, sum, out, {batch, t, head, col});
        });
      });
}

gpu::LaunchOp mlir::nsa::detail::buildCombineGradKernel(
    OpBuilder &b, Location loc, int64_t qHeads, int64_t vDim,
    ArrayRef<Value> branches, Value gates, Value grad,
    ArrayRef<Value> branchGrads, Value gatesGrad, ArrayRef<Value> deltas,
    StringRef kernelName) {
  assert(branches.size() == 3 && branchGrads.size() == 3 &&
         deltas.size() == 3 && combineGradFits(vDim) &&
         "three branches, Dv / 8 a power of 2");
  Emit e{b, loc};
  Type f32 = b.getF32Type();
  auto vecF32 = VectorType::get({8}, f32);
  int64_t chunks = vDim / 8;
  return launchRows(
      e, grad, qHeads, vDim, kernelName,
      [&](Value valid, Value batch, Value t, Value head, Value col) {
        SmallVector<Value, 4> at = {batch, t, head, col};
        Value dout = loadEight(e, grad, at);
        for (int64_t i = 0; i < 3; ++i) {
          Value sig = sigmoid(
              e, arith::ExtFOp::create(
                     b, loc, f32, e.load(gates, {batch, t, head, e.idx(i)})));
          // do_b = sigmoid(g_b) do.
          Value scaled = arith::MulFOp::create(
              b, loc, vector::BroadcastOp::create(b, loc, vecF32, sig), dout);
          e.ifThen(valid, [&] { storeEight(e, scaled, branchGrads[i], at); });
          // dg_b = sigmoid'(g_b) (o_b . do): this thread's 8 terms, then
          // the row's chunks by xor shuffles (lanes of one row differ in
          // their low log2(chunks) bits).
          Value o = loadEight(e, branches[i], at);
          auto rowSum = [&](Value x) {
            Value dot = vector::ReductionOp::create(
                b, loc, vector::CombiningKind::ADD, e.fmul(o, x));
            for (int64_t off = chunks / 2; off >= 1; off /= 2)
              dot = e.fadd(dot, e.shuffleXor(dot, off));
            return dot;
          };
          Value dot = rowSum(dout);
          // D_b = rowsum(do_b o_b) with do_b as stored (bf16).
          Value delta;
          if (deltas[i]) {
            auto vecBF16 = VectorType::get({8}, b.getBF16Type());
            delta = rowSum(arith::ExtFOp::create(
                b, loc, vecF32,
                arith::TruncFOp::create(b, loc, vecBF16, scaled).getResult()));
          }
          Value deriv = e.fmul(sig, e.fsub(e.f32(1), sig));
          e.ifThen(e.andi(valid, e.eq(col, e.idx(0))), [&] {
            e.store(arith::TruncFOp::create(
                        b, loc,
                        cast<MemRefType>(gatesGrad.getType()).getElementType(),
                        e.fmul(deriv, dot)),
                    gatesGrad, {batch, t, head, e.idx(i)});
            if (delta)
              e.store(delta, deltas[i], {batch, t, head});
          });
        }
      });
}
