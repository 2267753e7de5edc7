//===- FlashGradDelta.cpp - the rows' D and lse2 of the gradients ---------===//
//
// The first of the three launches of each attention gradient (FlashGrad.cpp
// builds the other two): lse2 = lse log2(e) (+inf where lse is -inf, so
// that the dq and dk, dv kernels take P = 0) and, unless the combine_grad
// kernel wrote it (deltaReady), D = rowsum(grad * output) of every (batch,
// token, head) row, a thread each, 8 bf16 columns a load.
//
//===----------------------------------------------------------------------===//

#include "FlashBuilder.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <cmath>

using namespace mlir;
using namespace mlir::nsa::detail;
using namespace mlir::nsa::detail::flash;

void mlir::nsa::detail::buildFlashGradDeltaKernel(OpBuilder &b, Location loc,
                                                  const FlashGradConfig &c,
                                                  const FlashGradOperands &ops,
                                                  StringRef kernelName) {
  Type f32 = b.getF32Type(), bf16 = b.getBF16Type();
  auto vecBF16 = VectorType::get({8}, bf16), vecF32 = VectorType::get({8}, f32);
  launchPerRow(
      b, loc, ops.q, c.kvHeads * c.group, /*threads=*/128, kernelName,
      [&](Emit &e, Value batch, Value t, Value head, Value) {
        Value lse = e.load(ops.lse, {batch, t, head});
        Value none = e.fcmp(arith::CmpFPredicate::OEQ, lse, e.f32(-INFINITY));
        e.store(e.sel(none, e.f32(INFINITY), e.fmul(lse, e.f32(M_LOG2E))),
                ops.lse2, {batch, t, head});
        if (ops.deltaReady)
          return;
        Value zero = arith::ConstantOp::create(
            b, loc, vecF32,
            DenseElementsAttr::get(vecF32, b.getF32FloatAttr(0)));
        auto sum = scf::ForOp::create(
            b, loc, e.idx(0), e.idx(c.vDim), e.idx(8), ValueRange{zero},
            [&](OpBuilder &, Location, Value col, ValueRange acc) {
              auto in = [&](Value m) {
                Value loaded = vector::LoadOp::create(
                    b, loc, vecBF16, m, ValueRange{batch, t, head, col},
                    /*nontemporal=*/false, llvm::MaybeAlign(16));
                return arith::ExtFOp::create(b, loc, vecF32, loaded)
                    .getResult();
              };
              Value next = vector::FMAOp::create(b, loc, in(ops.grad),
                                                 in(ops.out), acc[0]);
              scf::YieldOp::create(b, loc, ValueRange{next});
            });
        Value d = vector::ReductionOp::create(
            b, loc, vector::CombiningKind::ADD, sum.getResult(0));
        e.store(d, ops.delta, {batch, t, head});
      });
}
