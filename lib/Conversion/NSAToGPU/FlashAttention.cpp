//===- FlashAttention.cpp - the flash GPU strategy for attention branches -===//
//
// `nsa-flash-attention`, in nsa-to-ptx between nsa-decompose and nsa-tile:
//
//   nsa.window_attention / compressed_attention / selected_attention
//     (tensors)
//   --> bufferization.to_buffer of the operands, memref.alloc of O and lse,
//       one gpu.launch built by FlashKernel.cpp,
//       bufferization.to_tensor (restrict) of O and lse
//
// One-shot bufferization then sees buffers that alias nothing, and
// nsa-map-to-gpu turns the two allocations into device buffers and leaves
// the launch as it is. Ops whose shapes the kernels do not take stay for
// nsa-tile and the generic mapping; the pass says why in a remark.
//
//===----------------------------------------------------------------------===//

#include "FlashDecode.h"
#include "FlashKernel.h"

#include "NSA/Transforms/TileBuilder.h"

#include "NSA/Dialect/NSAOps.h"
#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::nsa {
#define GEN_PASS_DEF_FLASHATTENTION
#include "NSA/Transforms/Passes.h.inc"
} // namespace mlir::nsa

using namespace mlir;
using namespace mlir::nsa;
using namespace mlir::nsa::detail;

namespace {

/// `tensor` as an identity-layout buffer, as one-shot bufferization with
/// identity function boundaries gives it.
Value bufferOf(OpBuilder &b, Location loc, Value tensor) {
  if (!tensor)
    return {};
  auto type = cast<RankedTensorType>(tensor.getType());
  return bufferization::ToBufferOp::create(
      b, loc, MemRefType::get(type.getShape(), type.getElementType()), tensor,
      /*read_only=*/true);
}

/// A fresh buffer of the shape of `like` (a result of the op), with the
/// dynamic sizes read off `sizesFrom`'s leading dimensions.
Value allocLike(OpBuilder &b, Location loc, Type like, Value sizesFrom) {
  auto type = cast<RankedTensorType>(like);
  SmallVector<Value> dynamic;
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (type.isDynamicDim(d))
      dynamic.push_back(tensor::DimOp::create(b, loc, sizesFrom, d));
  return memref::AllocOp::create(
      b, loc, MemRefType::get(type.getShape(), type.getElementType()),
      dynamic);
}

/// Whether host code at `op` can use `value`: defined before it in its
/// block, or a block argument of a region around it.
bool availableAt(Value value, Operation *op) {
  Operation *def = value.getDefiningOp();
  return def ? def->getBlock() == op->getBlock() && def->isBeforeInBlock(op)
             : value.getParentRegion()->isAncestor(op->getParentRegion());
}

/// The memref that `result` is materialized into when that is its only use
/// (`bufferization.materialize_in_destination ... in restrict writable`, a
/// memref of its shape with the identity layout, available at `op`, used
/// by nothing else); the materialization is erased, as the kernel of `op`
/// writes its result there. Else null.
Value takeDestination(Operation *op, Value result) {
  if (!result.hasOneUse())
    return {};
  auto m = dyn_cast<bufferization::MaterializeInDestinationOp>(
      *result.getUsers().begin());
  if (!m || !m.getRestrict() || !m.getWritable())
    return {};
  Value dest = m.getDest();
  if (!dest.hasOneUse())
    return {};
  auto type = dyn_cast<MemRefType>(dest.getType());
  auto tensor = cast<RankedTensorType>(result.getType());
  if (!type || !type.getLayout().isIdentity() || type.getMemorySpace() ||
      type.getShape() != tensor.getShape() ||
      type.getElementType() != tensor.getElementType())
    return {};
  if (!availableAt(dest, op))
    return {};
  m.erase();
  return dest;
}

/// Where the kernel of `op` writes `result`: its destination
/// (takeDestination), else a fresh buffer sized from `sizesFrom`.
Value outputBuffer(OpBuilder &b, Operation *op, Value result, Value sizesFrom) {
  if (Value dest = takeDestination(op, result))
    return dest;
  return allocLike(b, op->getLoc(), result.getType(), sizesFrom);
}

/// The linalg.generic that is the only use of `dq` (an attention gradient
/// op's f32 query gradient) where it is a sum like nsa-decompose's of the
/// branches' dq: the same f32 type for every input, identity maps, parallel
/// iterators, a body adding the inputs in order and, where the result's
/// element type is not f32, rounding the sum once (arith.truncf, default
/// rounding). Only where `dq` is one of the inputs, once, and the others
/// can be read by the kernels of `op` (availableAt). With `varlen` (rows
/// outside every sequence no kernel writes) only where every other input
/// is a dq of this pass's that is zero there (to_tensor of a buffer in
/// `zeroed`), as the sum then is too. Else null.
linalg::GenericOp fusableDqSum(Value dq, Operation *op, bool varlen,
                               const DenseSet<Value> &zeroed) {
  if (!dq.hasOneUse())
    return {};
  auto g = dyn_cast<linalg::GenericOp>(*dq.getUsers().begin());
  if (!g || g.getNumDpsInits() != 1 || g.getNumDpsInputs() < 2 ||
      g.getNumResults() != 1 ||
      !llvm::all_of(g.getIndexingMapsArray(),
                    [](AffineMap m) { return m.isIdentity(); }) ||
      g.getNumParallelLoops() != g.getNumLoops())
    return {};
  auto resultType = cast<RankedTensorType>(g.getResult(0).getType());
  auto dqType = cast<RankedTensorType>(dq.getType());
  Type elt = resultType.getElementType();
  if (resultType.getShape() != dqType.getShape() ||
      !(elt.isF32() || elt.isBF16()) || llvm::count(g.getDpsInputs(), dq) != 1)
    return {};
  for (Value input : g.getDpsInputs()) {
    if (input.getType() != dqType)
      return {};
    if (input == dq)
      continue;
    auto tensor = input.getDefiningOp<bufferization::ToTensorOp>();
    if (!availableAt(input, op) ||
        (varlen && !(tensor && zeroed.contains(tensor.getBuffer()))))
      return {};
  }
  // The body: ((in0 + in1) + in2) ..., then truncf where elt is not f32.
  Block &body = g.getRegion().front();
  unsigned n = g.getNumDpsInputs(), next = 1;
  Value sum = body.getArgument(0);
  for (Operation &inner : body.without_terminator()) {
    if (auto add = dyn_cast<arith::AddFOp>(inner);
        add && next < n && add.getLhs() == sum &&
        add.getRhs() == body.getArgument(next)) {
      sum = add;
      ++next;
      continue;
    }
    auto trunc = dyn_cast<arith::TruncFOp>(inner);
    if (!trunc || next != n || trunc.getIn() != sum || !sum.getType().isF32() ||
        trunc.getRoundingmodeAttr() || trunc.getType() != elt)
      return {};
    sum = trunc;
  }
  auto yield = cast<linalg::YieldOp>(body.getTerminator());
  if (next != n || yield.getValues().size() != 1 ||
      yield.getValues()[0] != sum || sum.getType() != elt)
    return {};
  return g;
}

struct FlashAttentionPass
    : mlir::nsa::impl::FlashAttentionBase<FlashAttentionPass> {
  using Base::Base;

  /// The kernel of the next op: `<function>_<what>_flash_<k>`.
  std::string kernelName(StringRef what) {
    return (getOperation().getName() + "_" + what + "_flash_" +
            Twine(count++))
        .str();
  }

  /// Leaves `op` to the generic mapping, saying why.
  static void leave(Operation *op, const Twine &why) {
    op->emitRemark("nsa-flash-attention: left to the generic mapping: ")
        << why;
  }

  /// Replaces the results of `op` by the tensors of `buffers`, which the
  /// kernel wrote, and erases it.
  static void replaceWithBuffers(OpBuilder &b, Operation *op,
                                 ValueRange buffers) {
    for (auto [result, buffer] : llvm::zip_equal(op->getResults(), buffers))
      if (buffer) // (else unused)
        result.replaceAllUsesWith(bufferization::ToTensorOp::create(
            b, op->getLoc(), result.getType(), buffer, b.getUnitAttr(),
            b.getUnitAttr()));
    op->erase();
  }

  bool takes(StringRef what) const {
    // "window_attention" is taken by "window", and so on.
    return ops.empty() || llvm::is_contained(ops, what.split('_').first.str());
  }

  /// The common part of a config, or a reason to leave `op` alone.
  static std::string configure(Value q, Value k, Value v, FlashConfig &c) {
    auto qt = cast<RankedTensorType>(q.getType());
    auto kt = cast<RankedTensorType>(k.getType());
    auto vt = cast<RankedTensorType>(v.getType());
    if (!qt.getElementType().isBF16())
      return "the flash kernels take bf16";
    for (RankedTensorType t : {qt, kt, vt})
      if (t.isDynamicDim(2) || t.isDynamicDim(3))
        return "dynamic head counts or dims";
    c.kvHeads = kt.getDimSize(2);
    c.group = qt.getDimSize(2) / c.kvHeads;
    c.qkDim = qt.getDimSize(3);
    c.vDim = vt.getDimSize(3);
    return "";
  }

  /// The buffers of attention op `op` (results O, lse) at `b`: its inputs,
  /// and where O (or `outResult`, which the kernel writes instead) and lse
  /// go (outputBuffer).
  static FlashOperands attentionOperands(OpBuilder &b, Operation *op, Value q,
                                         Value k, Value v, Value indices,
                                         Value cu, Value outResult = {}) {
    Location loc = op->getLoc();
    FlashOperands operands;
    operands.q = bufferOf(b, loc, q);
    operands.k = bufferOf(b, loc, k);
    operands.v = bufferOf(b, loc, v);
    operands.indices = bufferOf(b, loc, indices);
    operands.cuSeqlens = bufferOf(b, loc, cu);
    operands.out =
        outputBuffer(b, op, outResult ? outResult : op->getResult(0), q);
    operands.lse = outputBuffer(b, op, op->getResult(1), q);
    return operands;
  }

  /// Replaces `op` (results O, lse) by the kernel of `c`.
  void replace(Operation *op, const FlashConfig &c, Value q, Value k, Value v,
               Value indices, Value cu, StringRef what) {
    OpBuilder b(op);
    FlashOperands operands = attentionOperands(b, op, q, k, v, indices, cu);
    buildFlashKernel(b, op->getLoc(), c, operands, kernelName(what));
    replaceWithBuffers(b, op, {operands.out, operands.lse});
  }

  /// Whether the kernels take `op` (configured from q, k, v): else says
  /// why in a remark.
  bool accepts(Operation *op, Value q, Value k, Value v, FlashConfig &c) {
    std::string why = configure(q, k, v, c);
    if (why.empty() && !c.select &&
        (c.keys == FlashKeys::Window || c.keys == FlashKeys::Compressed))
      chooseTiles(c);
    if (why.empty() && c.keys == FlashKeys::Selected)
      chooseSelectedRows(c);
    c.tma = sm90 && why.empty() && tmaFits(c);
    c.wgmma = c.tma && wgmmaFits(c);
    // Overlap pays for compressed attention's two warpgroups; window
    // attention's one warpgroup is slower with it and keeps the plain
    // loop. Taking turns (pingpong) helps the paper dims and hurts D128,
    // so it is off by default (docs/Benchmarks.md, the variants).
    c.overlap =
        overlap && c.wgmma && !c.select && c.stages == 2 &&
        c.releasesStages() &&
        (c.keys == FlashKeys::Window || c.keys == FlashKeys::Compressed);
    c.pingpong = c.overlap && pingpong && c.warps() == 8;
    if (why.empty())
      why = checkFlashConfig(c);
    if (why.empty())
      return true;
    leave(op, why);
    return false;
  }

  /// Takes `op` with `c` when the kernels can.
  void take(Operation *op, FlashConfig &c, Value q, Value k, Value v,
            Value indices, Value cu, StringRef what) {
    if (takes(what) && accepts(op, q, k, v, c))
      replace(op, c, q, k, v, indices, cu, what);
  }

  /// The nsa.combine that can be `window`'s epilogue: its only user, taking
  /// its O as the window branch, with the other inputs defined before it
  /// in its block (or arguments), and of the types takeCombine takes.
  CombineOp fusableCombine(WindowAttentionOp window) {
    Value o = window->getResult(0);
    if (!fuseCombine || !takes("combine") || !o.hasOneUse())
      return {};
    auto combine = dyn_cast<CombineOp>(*o.getUsers().begin());
    if (!combine || combine.getWindow() != o || !combineFits(combine))
      return {};
    for (Value in :
         {combine.getCompressed(), combine.getSelected(), combine.getGates()}) {
      Operation *def = in.getDefiningOp();
      if (def ? def->getBlock() != window->getBlock() ||
                    !def->isBeforeInBlock(window)
              : cast<BlockArgument>(in).getOwner() != window->getBlock())
        return {};
    }
    return combine;
  }

  /// Window attention with `combine` as its epilogue: one kernel writes
  /// the layer's output; the window's O is never stored. Whether it took
  /// both.
  bool takeWindowCombined(WindowAttentionOp op, CombineOp combine,
                          FlashConfig &c) {
    if (!takes("window") ||
        !accepts(op, op.getQuery(), op.getKey(), op.getValue(), c))
      return false;
    OpBuilder b(op);
    Location loc = op.getLoc();
    FlashOperands operands =
        attentionOperands(b, op, op.getQuery(), op.getKey(), op.getValue(), {},
                          op.getCuSeqlens(), combine.getResult());
    operands.combineCmp = bufferOf(b, loc, combine.getCompressed());
    operands.combineSlc = bufferOf(b, loc, combine.getSelected());
    operands.combineGates = bufferOf(b, loc, combine.getGates());
    buildFlashKernel(b, loc, c, operands, kernelName("window_attention"));
    replaceWithBuffers(b, combine, {operands.out});
    replaceWithBuffers(b, op, {operands.out, operands.lse});
    return true;
  }

  /// nsa.select_blocks: reads q, the compressed keys and lse; writes the
  /// indices.
  void takeSelect(SelectBlocksOp op, FlashConfig &c) {
    // configure() reads Dv off its third operand: the keys stand in.
    if (!takes("select") ||
        !accepts(op, op.getQuery(), op.getKey(), op.getKey(), c))
      return;
    OpBuilder b(op);
    Location loc = op.getLoc();
    FlashOperands operands;
    operands.q = bufferOf(b, loc, op.getQuery());
    operands.k = bufferOf(b, loc, op.getKey());
    operands.lse = bufferOf(b, loc, op.getLse());
    operands.cuSeqlens = bufferOf(b, loc, op.getCuSeqlens());
    operands.indices = allocLike(b, loc, op.getType(), op.getQuery());
    buildFlashKernel(b, loc, c, operands, kernelName("select_blocks"));
    replaceWithBuffers(b, op, {operands.indices});
  }

  /// Selected attention block-major where `selected-order` asks for it
  /// (auto: G <= 4) and the kernel takes it: one wgmma block of 64 rows per
  /// work item, no cu_seqlens. Whether it took `op`.
  bool takeBlockMajor(SelectedAttentionOp op, const FlashConfig &tokenMajor) {
    if (!takes("selected") || selectedOrder == "token" || !sm90 ||
        op.getCuSeqlens())
      return false;
    FlashConfig c = tokenMajor;
    c.keys = FlashKeys::Gathered;
    c.warpsM = 4;
    c.warpsN = 1;
    if (!configure(op.getQuery(), op.getKey(), op.getValue(), c).empty() ||
        (selectedOrder == "auto" && c.group > 4))
      return false;
    c.tma = tmaFits(c);
    c.wgmma = c.tma && wgmmaFits(c);
    if (!checkFlashConfig(c).empty())
      return false;
    OpBuilder b(op);
    FlashOperands operands =
        attentionOperands(b, op, op.getQuery(), op.getKey(), op.getValue(),
                          op.getIndices(), /*cu=*/{});
    buildBlockMajorSelected(b, op.getLoc(), c, operands,
                            kernelName("selected_attention_by_block"));
    replaceWithBuffers(b, op, {operands.out, operands.lse});
    return true;
  }

  /// nsa.compress (bf16): one thread per two elements of a compressed row.
  void takeCompress(CompressOp op) {
    if (!takes("compress"))
      return;
    auto type = cast<RankedTensorType>(op.getInput().getType());
    if (!type.getElementType().isBF16())
      return leave(op, "the flash kernels take bf16");
    if (type.isDynamicDim(2) || type.isDynamicDim(3) || type.getDimSize(3) % 2)
      return leave(op, "dynamic heads or an odd dim");
    CompressConfig c;
    c.heads = type.getDimSize(2);
    c.dim = type.getDimSize(3);
    c.block = op.getBlock();
    c.stride = op.getStride();
    OpBuilder b(op);
    Location loc = op.getLoc();
    Value cu = bufferOf(b, loc, op.getCuSeqlens());
    // Rows, as nsa-tile sizes them: numCompressedBlocks(T), or T / d in the
    // packed layout (Spec section 3), whose rows past the last sequence's
    // are zero.
    TileBuilder t(b, loc);
    auto resultType = cast<RankedTensorType>(op.getType());
    SmallVector<Value> dynamic;
    if (resultType.isDynamicDim(0))
      dynamic.push_back(t.dim(op.getInput(), 0));
    if (resultType.isDynamicDim(1)) {
      Value tokens = t.dim(op.getInput(), 1);
      dynamic.push_back(cu ? t.div(tokens, c.stride)
                           : t.numCompressedBlocks(tokens, c.block, c.stride));
    }
    Value out = memref::AllocOp::create(
        b, loc,
        MemRefType::get(resultType.getShape(), resultType.getElementType()),
        dynamic);
    if (cu)
      linalg::FillOp::create(
          b, loc,
          ValueRange{arith::ConstantOp::create(
              b, loc, b.getFloatAttr(resultType.getElementType(), 0.0))},
          ValueRange{out});
    buildCompressKernel(b, loc, c, bufferOf(b, loc, op.getInput()),
                        bufferOf(b, loc, op.getWeights()), cu, out,
                        kernelName("compress"));
    replaceWithBuffers(b, op, {out});
  }

  /// Whether the combine kernel (and the window kernel's combine epilogue)
  /// take `op`: bf16, static heads, Dv a multiple of 8.
  static bool combineFits(CombineOp op) {
    auto type = cast<RankedTensorType>(op.getType());
    return type.getElementType().isBF16() &&
           cast<RankedTensorType>(op.getGates().getType())
               .getElementType()
               .isBF16() &&
           !type.isDynamicDim(2) && !type.isDynamicDim(3) &&
           type.getDimSize(3) % 8 == 0;
  }

  /// nsa.combine: 16-byte vectors per thread.
  void takeCombine(CombineOp op) {
    if (!takes("combine"))
      return;
    auto type = cast<RankedTensorType>(op.getType());
    if (!combineFits(op))
      return leave(op, "combine takes bf16 with static heads and Dv a "
                       "multiple of 8");
    OpBuilder b(op);
    Location loc = op.getLoc();
    Value out = outputBuffer(b, op, op.getResult(), op.getCompressed());
    buildCombineKernel(b, loc, type.getDimSize(2), type.getDimSize(3),
                       bufferOf(b, loc, op.getCompressed()),
                       bufferOf(b, loc, op.getSelected()),
                       bufferOf(b, loc, op.getWindow()),
                       bufferOf(b, loc, op.getGates()), out,
                       kernelName("combine"));
    replaceWithBuffers(b, op, {out});
  }

  /// nsa.combine_grad: the kernel of Gating.cpp (the branch outputs and
  /// gates bf16, static heads, Dv / 8 a power of two of at most 32).
  void takeCombineGrad(CombineGradOp op) {
    if (!takes("combine_grad"))
      return;
    auto type = cast<RankedTensorType>(op.getCompressed().getType());
    auto gatesType = cast<RankedTensorType>(op.getGates().getType());
    if (!type.getElementType().isBF16() ||
        !gatesType.getElementType().isBF16() || type.isDynamicDim(2) ||
        type.isDynamicDim(3) || !combineGradFits(type.getDimSize(3)))
      return leave(op, "combine_grad takes bf16 with static heads and Dv / 8 "
                       "a power of two of at most 32");
    OpBuilder b(op);
    Location loc = op.getLoc();
    Value grad = op.getGrad();
    SmallVector<Value> outs;
    for (Value result : op.getResults())
      outs.push_back(outputBuffer(b, op, result, grad));
    // The rows' D of the attention gradients that take a branch's do_b with
    // that branch's output, as D = rowsum(do_b o_b) reads what this kernel
    // has in registers.
    Value branches[] = {op.getCompressed(), op.getSelected(), op.getWindow()};
    SmallVector<Value> deltas(3);
    for (int64_t i = 0; i < 3 && gradFuseDelta; ++i)
      for (Operation *user : op.getResult(i).getUsers()) {
        Value output =
            TypeSwitch<Operation *, Value>(user)
                .Case<WindowAttentionGradOp, CompressedAttentionGradOp,
                      SelectedAttentionGradOp>([&](auto g) {
                  return g.getGrad() == op.getResult(i) ? g.getOutput()
                                                        : Value();
                })
                .Default([](Operation *) { return Value(); });
        if (output != branches[i])
          continue;
        if (!deltas[i])
          deltas[i] =
              allocLike(b, loc,
                        RankedTensorType::get(type.getShape().drop_back(),
                                              b.getF32Type()),
                        grad);
        givenDelta[user] = deltas[i];
      }
    buildCombineGradKernel(b, loc, type.getDimSize(2), type.getDimSize(3),
                           {bufferOf(b, loc, branches[0]),
                            bufferOf(b, loc, branches[1]),
                            bufferOf(b, loc, branches[2])},
                           bufferOf(b, loc, op.getGates()),
                           bufferOf(b, loc, grad), {outs[0], outs[1], outs[2]},
                           outs[3], deltas, kernelName("combine_grad"));
    replaceWithBuffers(b, op, outs);
  }

  /// nsa.window_attention_grad or nsa.compressed_attention_grad (`c` has
  /// its keys and attributes): the three gradient launches
  /// (buildFlashGradKernels) writing dq, dk and dv.
  template <typename GradOp>
  void takeGrad(GradOp op, FlashGradConfig &c, StringRef what) {
    if (!takes(what))
      return;
    FlashConfig dims;
    std::string why =
        configure(op.getQuery(), op.getKey(), op.getValue(), dims);
    if (why.empty() && (!cast<RankedTensorType>(op.getGrad().getType())
                             .getElementType()
                             .isBF16() ||
                        !cast<RankedTensorType>(op.getOutput().getType())
                             .getElementType()
                             .isBF16()))
      why = "the gradient kernels take a bf16 output and gradient";
    c.kvHeads = dims.kvHeads;
    c.group = dims.group;
    c.qkDim = dims.qkDim;
    c.vDim = dims.vDim;
    // Compressed and selected key blocks: the first ones see nearly every
    // token, the last few; chunks of grad-chunk-tokens even out the blocks
    // (and adding the chunks from the last one evens out the tail).
    if (c.keys != FlashKeys::Window)
      c.chunkTokens = gradChunkTokens;
    c.deterministic = gradDeterministic;
    // By wgmma with sm90 where the kernels fit; window and compressed
    // attention's dq tiles from grad-key-tile, else 32 keys (with wgmma:
    // two blocks an SM, faster than 48 or 64 keys).
    c.wgmma = sm90 && gradWgmma && gradWgmmaFits(c);
    c.tma = c.wgmma && gradTma;
    // Selected dq: 32 rows (two tokens of G = 16 heads) with wgmma, whose
    // chosen blocks mostly coincide, so a block reads the union of about
    // as many key tiles for twice the rows.
    if (c.keys == FlashKeys::Selected)
      c.selectedQueryRows = gradSelectedRows               ? gradSelectedRows
                            : c.wgmma && c.group % 16 == 0 ? 32
                                                           : 16;
    if (c.keys != FlashKeys::Selected && gradKeyTile)
      c.queryKeyTile = gradKeyTile;
    if (why.empty())
      why = checkFlashGradConfig(c);
    if (!why.empty())
      return leave(op, why);
    OpBuilder b(op);
    Location loc = op.getLoc();
    FlashGradOperands ops;
    ops.q = bufferOf(b, loc, op.getQuery());
    ops.k = bufferOf(b, loc, op.getKey());
    ops.v = bufferOf(b, loc, op.getValue());
    ops.out = bufferOf(b, loc, op.getOutput());
    ops.lse = bufferOf(b, loc, op.getLse());
    ops.grad = bufferOf(b, loc, op.getGrad());
    ops.cuSeqlens = bufferOf(b, loc, op.getCuSeqlens());
    if constexpr (std::is_same_v<GradOp, SelectedAttentionGradOp>)
      ops.indices = bufferOf(b, loc, op.getIndices());
    // The branches' sum of dq as this kernel's epilogue, where this is the
    // last of them (the others are buffers already).
    linalg::GenericOp sum =
        gradFuseSum ? fusableDqSum(op.getQueryGrad(), op,
                                   ops.cuSeqlens != nullptr, zeroedDq)
                    : linalg::GenericOp();
    if (sum) {
      for (Value term : sum.getDpsInputs())
        ops.dqTerms.push_back(
            term == op.getQueryGrad() ? Value() : bufferOf(b, loc, term));
      ops.dq = outputBuffer(b, op, sum.getResult(0), op.getQuery());
    } else {
      ops.dq = outputBuffer(b, op, op.getQueryGrad(), op.getQuery());
    }
    ops.dk = outputBuffer(b, op, op.getKeyGrad(), op.getKey());
    ops.dv = outputBuffer(b, op, op.getValueGrad(), op.getValue());
    if (Value given = givenDelta.lookup(op)) {
      ops.delta = given;
      ops.deltaReady = true;
    } else {
      ops.delta = allocLike(b, loc, op.getLse().getType(), op.getLse());
    }
    ops.lse2 = allocLike(b, loc, op.getLse().getType(), op.getLse());
    Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0));
    auto fill = [&](Value out, Value value) {
      linalg::FillOp::create(b, loc, ValueRange{value}, ValueRange{out});
    };
    if (ops.cuSeqlens) {
      // Rows outside every sequence (and the packed compressed rows past
      // the last sequence's) are not written by the kernels.
      Type elt = cast<MemRefType>(ops.dq.getType()).getElementType();
      fill(ops.dq, arith::ConstantOp::create(b, loc, b.getZeroAttr(elt)));
      zeroedDq.insert(ops.dq);
    }
    if (ops.cuSeqlens || c.chunkTokens) {
      // (Chunks add into dk and dv.)
      fill(ops.dk, zero);
      fill(ops.dv, zero);
    }
    if (c.chunkTokens) {
      TileBuilder t(b, loc);
      Value sequences = ops.cuSeqlens
                            ? t.sub(t.dim(op.getCuSeqlens(), 0), t.idx(1))
                            : t.dim(op.getQuery(), 0);
      Value blocks = arith::CeilDivSIOp::create(b, loc, t.dim(op.getKey(), 1),
                                                t.idx(16 * c.keyWarps));
      Value count = t.mul(t.mul(sequences, c.kvHeads), blocks);
      ops.turns = memref::AllocOp::create(
          b, loc, MemRefType::get({ShapedType::kDynamic}, b.getI32Type()),
          ValueRange{count});
      fill(ops.turns,
           arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(0)));
    }
    buildFlashGradKernels(b, loc, c, ops, kernelName(what));
    if (sum) {
      replaceWithBuffers(b, sum, {ops.dq});
      replaceWithBuffers(b, op, {Value(), ops.dk, ops.dv});
    } else {
      replaceWithBuffers(b, op, {ops.dq, ops.dk, ops.dv});
    }
  }

  /// The nsa.compress_append ops of a decoding step (bf16, static heads, an
  /// even dim), those of the same lengths and config (the keys' and the
  /// values') as one launch that writes each step's new compressed rows
  /// where its result is materialized (a writable argument the runtime
  /// gives the cache's own address: in place), or into a fresh buffer; out
  /// of place the kernel copies the other rows.
  void takeCompressAppends(ArrayRef<CompressAppendOp> all) {
    if (!takes("decode"))
      return;
    auto configOf = [&](CompressAppendOp op) {
      auto type = cast<RankedTensorType>(op.getInput().getType());
      AppendConfig c;
      c.heads = type.getDimSize(2);
      c.block = op.getBlock();
      c.stride = op.getStride();
      c.appended = op.getAppended();
      c.gridDeps = sm90;
      return c;
    };
    SmallVector<CompressAppendOp> ops;
    for (CompressAppendOp op : all) {
      auto type = cast<RankedTensorType>(op.getInput().getType());
      auto cacheType = cast<RankedTensorType>(op.getType());
      if (!type.getElementType().isBF16() ||
          !cacheType.getElementType().isBF16() || type.isDynamicDim(2) ||
          type.isDynamicDim(3) || type.getDimSize(3) % 2)
        leave(op, "compress_append takes bf16 with static heads and an even "
                  "dim");
      else
        ops.push_back(op);
    }
    llvm::SmallPtrSet<Operation *, 4> done;
    for (CompressAppendOp op : ops) {
      if (done.contains(op))
        continue;
      // Its partners: later in the block, the same lengths and config, no
      // use of an earlier one's result before the last of them.
      AppendConfig c = configOf(op);
      SmallVector<CompressAppendOp> group{op};
      for (CompressAppendOp other : ops)
        if (other != op && !done.contains(other) &&
            other->getBlock() == op->getBlock() && op->isBeforeInBlock(other) &&
            other.getKvLens() == op.getKvLens() &&
            configOf(other).heads == c.heads &&
            configOf(other).block == c.block &&
            configOf(other).stride == c.stride &&
            configOf(other).appended == c.appended &&
            llvm::all_of(group, [&](CompressAppendOp g) {
              return llvm::all_of(g->getUsers(), [&](Operation *u) {
                return u->getBlock() == other->getBlock() &&
                       other->isBeforeInBlock(u);
              });
            }))
          group.push_back(other);
      Operation *last = group.back();
      OpBuilder b(last);
      Location loc = last->getLoc();
      SmallVector<AppendOperands> operands;
      for (CompressAppendOp g : group) {
        auto cacheType = cast<RankedTensorType>(g.getType());
        // The destination the result is materialized into, if any.
        Value dst;
        for (Operation *user : g->getUsers()) {
          auto m = dyn_cast<bufferization::MaterializeInDestinationOp>(user);
          auto destType =
              m ? dyn_cast<MemRefType>(m.getDest().getType()) : MemRefType();
          if (!m || !m.getRestrict() || !m.getWritable() || !destType ||
              !destType.getLayout().isIdentity() || destType.getMemorySpace() ||
              destType.getShape() != cacheType.getShape() ||
              !availableAt(m.getDest(), last))
            continue;
          dst = m.getDest();
          m.erase();
          break;
        }
        if (!dst)
          dst = allocLike(b, loc, cacheType, g.getCompressed());
        AppendOperands a;
        a.input = bufferOf(b, loc, g.getInput());
        a.weights = bufferOf(b, loc, g.getWeights());
        a.src = bufferOf(b, loc, g.getCompressed());
        a.dst = dst;
        a.dim = cast<RankedTensorType>(g.getInput().getType()).getDimSize(3);
        operands.push_back(a);
      }
      // Under a guard, true until a step that pools the new rows itself
      // (takeDecode) makes it skip the launch where it does.
      auto guard = scf::IfOp::create(
          b, loc, arith::ConstantIntOp::create(b, loc, 1, 1),
          /*withElseRegion=*/false);
      {
        OpBuilder::InsertionGuard inGuard(b);
        b.setInsertionPoint(guard.thenBlock()->getTerminator());
        buildCompressAppendKernel(b, loc, c, operands,
                                  bufferOf(b, loc, op.getKvLens()),
                                  kernelName("compress_append"));
      }
      appendLaunches.push_back({guard, c, operands, op.getKvLens()});
      for (auto [g, a] : llvm::zip_equal(group, operands)) {
        done.insert(g);
        replaceWithBuffers(b, g, {a.dst});
      }
    }
  }

  /// An append launch (takeCompressAppends) and its guard.
  struct AppendLaunch {
    scf::IfOp guard;
    AppendConfig config;
    SmallVector<AppendOperands> operands;
    Value kvLens; ///< the tensor
  };
  SmallVector<AppendLaunch> appendLaunches;

  /// Folds the append launch that writes the step's compressed caches
  /// (`cmp`'s keys and values, read by `cmp` and `sel` alone) into the
  /// step where it may (appendsFoldable): `ops` gets its operands and its
  /// guard skips it where `_cluster` pools the rows.
  void foldAppends(const DecodeConfig &c, CompressedAttentionOp cmp,
                   SelectBlocksOp sel, Value lens, DecodeOperands &ops) {
    Operation *readers[] = {cmp, sel, ops.kc.getDefiningOp(),
                            ops.vc.getDefiningOp()};
    auto dstOf = [&](Value cache) -> Value {
      auto toTensor = cache.getDefiningOp<bufferization::ToTensorOp>();
      if (!toTensor || !llvm::all_of(toTensor->getUsers(), [&](Operation *u) {
            return llvm::is_contained(readers, u);
          }))
        return {};
      return toTensor.getBuffer();
    };
    Value kDst = dstOf(cmp.getKey()), vDst = dstOf(cmp.getValue());
    if (!kDst || !vDst)
      return;
    for (AppendLaunch &launch : appendLaunches) {
      if (launch.kvLens != lens || launch.operands.size() != 2)
        continue;
      AppendOperands k = launch.operands[0], v = launch.operands[1];
      if (k.dst == vDst)
        std::swap(k, v);
      if (k.dst != kDst || v.dst != vDst ||
          !appendsFoldable(c, launch.config, {k, v}))
        continue;
      ops.kcAppend = k;
      ops.vcAppend = v;
      ops.append = launch.config;
      OpBuilder b(launch.guard);
      Location loc = launch.guard.getLoc();
      Value fold =
          foldAppendsCondition(b, loc, c, launch.operands,
                               bufferOf(b, loc, launch.kvLens));
      launch.guard->setOperand(
          0, arith::XOrIOp::create(b, loc, fold,
                                   arith::ConstantIntOp::create(b, loc, 1, 1)));
      return;
    }
  }

  /// Whether `value` has no use, or one, by `user`.
  static bool usedOnlyBy(Value value, Operation *user) {
    return llvm::all_of(value.getUsers(),
                        [&](Operation *u) { return u == user; });
  }

  /// A decoding step (Spec section 12, as nsa-decompose builds it): the
  /// compressed, selected and window attention with `kv_lens` whose outputs
  /// only `combine` reads, the block selection between the first two that
  /// only the selected attention reads, the same queries, lengths and caches
  /// throughout, and no lse read by anything but the selection. The five
  /// ops become the split-K kernels of FlashDecode.cpp; `taken` gets them.
  /// Where they are such a step that the kernels do not take, says why.
  void takeDecode(CombineOp combine,
                  llvm::SmallPtrSetImpl<Operation *> &taken) {
    auto win = combine.getWindow().getDefiningOp<WindowAttentionOp>();
    auto slc = combine.getSelected().getDefiningOp<SelectedAttentionOp>();
    auto cmp = combine.getCompressed().getDefiningOp<CompressedAttentionOp>();
    if (!win || !slc || !cmp || !win.getKvLens())
      return;
    auto sel = slc.getIndices().getDefiningOp<SelectBlocksOp>();
    Value lens = win.getKvLens(), q = win.getQuery();
    if (!sel || slc.getKvLens() != lens || cmp.getKvLens() != lens ||
        sel.getKvLens() != lens || slc.getQuery() != q || cmp.getQuery() != q ||
        sel.getQuery() != q || sel.getLse() != cmp.getLse() ||
        sel.getKey() != cmp.getKey() || slc.getKey() != win.getKey() ||
        slc.getValue() != win.getValue())
      return;
    if (!usedOnlyBy(win.getOutput(), combine) ||
        !usedOnlyBy(slc.getOutput(), combine) ||
        !usedOnlyBy(cmp.getOutput(), combine) || !win.getLse().use_empty() ||
        !slc.getLse().use_empty() || !usedOnlyBy(cmp.getLse(), sel) ||
        !usedOnlyBy(sel.getResult(), slc))
      return leave(combine, "a decoding step whose branch results are read "
                            "elsewhere");
    if (!takes("decode"))
      return;
    DecodeConfig c;
    FlashConfig dims;
    std::string why = configure(q, win.getKey(), win.getValue(), dims);
    auto qType = cast<RankedTensorType>(q.getType());
    auto indicesType = cast<RankedTensorType>(slc.getIndices().getType());
    if (why.empty() && qType.isDynamicDim(1))
      why = "decode: a dynamic number of new tokens";
    if (why.empty() && indicesType.isDynamicDim(3))
      why = "decode: a dynamic number of selected blocks";
    auto bf16 = [](Value v) {
      return cast<RankedTensorType>(v.getType()).getElementType().isBF16();
    };
    if (why.empty() && !(bf16(cmp.getKey()) && bf16(cmp.getValue()) &&
                         bf16(combine.getGates()) && bf16(combine)))
      why = "decode: the kernels take bf16 caches, gates and output";
    if (why.empty() && (sel.getCmpBlock() != cmp.getBlock() ||
                        sel.getCmpStride() != cmp.getStride() ||
                        sel.getSlcBlock() != slc.getBlock() ||
                        sel.getScale() != cmp.getScale()))
      why = "decode: the selection's compression or scale differs from the "
            "compressed attention's";
    if (!why.empty())
      return leave(combine, why);
    c.kvHeads = dims.kvHeads;
    c.group = dims.group;
    c.qkDim = dims.qkDim;
    c.vDim = dims.vDim;
    c.queries = qType.getDimSize(1);
    c.cmpBlock = cmp.getBlock();
    c.cmpStride = cmp.getStride();
    c.slcBlock = slc.getBlock();
    c.numSelected = indicesType.getDimSize(3);
    c.window = win.getWindow();
    c.backbone = sel.getBackbone().getSpec();
    c.cmpScale = cmp.getScale().convertToDouble();
    c.slcScale = slc.getScale().convertToDouble();
    c.winScale = win.getScale().convertToDouble();
    c.chunkKeys = decodeChunkKeys;
    c.targetBlocks = decodeTargetBlocks;
    c.gridDeps = sm90;
    c.clusterBlocks = sm90 ? decodeClusterBlocks : 0;
    c.clusterSelect = decodeClusterSelect;
    c.clusterPush = decodeClusterPush;
    c.trace = decodeTrace;
    if (std::string why = checkDecodeConfig(c); !why.empty())
      return leave(combine, why);
    OpBuilder b(combine);
    Location loc = combine.getLoc();
    DecodeOperands ops;
    ops.q = bufferOf(b, loc, q);
    ops.k = bufferOf(b, loc, win.getKey());
    ops.v = bufferOf(b, loc, win.getValue());
    ops.kc = bufferOf(b, loc, cmp.getKey());
    ops.vc = bufferOf(b, loc, cmp.getValue());
    ops.gates = bufferOf(b, loc, combine.getGates());
    ops.kvLens = bufferOf(b, loc, lens);
    ops.out = outputBuffer(b, combine, combine.getResult(), q);
    foldAppends(c, cmp, sel, lens, ops);
    buildDecodeKernels(b, loc, c, ops, kernelName("decode"));
    Operation *group[] = {combine, win, slc, sel, cmp};
    taken.insert(std::begin(group), std::end(group));
    replaceWithBuffers(b, combine, {ops.out});
    for (Operation *op : ArrayRef<Operation *>(group).drop_front())
      op->erase();
  }

  int64_t count = 0;
  /// The dq buffers of gradient kernels filled with zero (fusableDqSum).
  DenseSet<Value> zeroedDq;
  /// The attention gradients whose rows' D a combine_grad kernel writes.
  DenseMap<Operation *, Value> givenDelta;

  /// Rows per block and keys per tile of window or compressed attention:
  /// the options where given, else the choice per kernel that measured
  /// fastest (docs/Benchmarks.md, the variants). Compressed attention walks
  /// up to T / d keys: with sm90, two warpgroups (128 rows) share 128-key
  /// tiles (S by m64n128k16, whose shared-memory reads per product are
  /// lower than n64's or n96's), in a 2-stage ring (a third stage would not
  /// fit in shared memory), where its wgmma kernel takes the shapes (else
  /// 64 and 64). The window's few tiles a block gain nothing from either
  /// (128 keys are slower there): 64 rows, 64 keys. `c` has its dims.
  ///
  /// 128-key tiles only where the block takes more than half an SM's
  /// shared memory (Q and the ring; the paper's dims and D128): a block
  /// that leaves room for a second gets 128 registers from
  /// nsa-kernel-occupancy's two blocks an SM, which those tiles exceed
  /// (Dqk = Dv = 64: 608 bytes of spill at 128 keys, 136 at 96, none at
  /// 64).
  void chooseTiles(FlashConfig &c) const {
    bool wide = c.keys == FlashKeys::Compressed && sm90;
    c.warpsM = (queryRows ? queryRows : wide ? 128 : 64) / 16;
    c.keyTile = kvTile ? kvTile : 64;
    if (wide && !kvTile && stages == 2) {
      // The wgmma kernel's shared memory with 128-key tiles.
      FlashConfig wideTiles = c;
      wideTiles.keyTile = 128;
      wideTiles.tma = wideTiles.wgmma = true;
      int64_t perBlock =
          flashSharedMemoryBytes(wideTiles) + kSharedReservedPerBlock;
      if (2 * perBlock > kSharedBytesPerSM)
        c.keyTile = wideTiles.keyTile;
    }
    if (wide && !queryRows && !kvTile && !(tmaFits(c) && wgmmaFits(c))) {
      c.warpsM = 4;
      c.keyTile = 64;
    }
  }

  /// Rows per block of token-major selected attention: `selected-rows`
  /// where given, else 32 for G a multiple of 16 (two tokens a block, two
  /// warps each splitting a block's keys: the block reads the union of
  /// their blocks once, the backbone's shared ones among them), else 16
  /// rows whose four warps split each block's keys. For the paper layer
  /// 32 rows measured faster than 16 or 64 (four warps of one token each)
  /// at 8k and 64k (docs/Benchmarks.md, the variants). `c` has its dims.
  void chooseSelectedRows(FlashConfig &c) const {
    int64_t rows = selectedRows ? selectedRows : c.group % 16 == 0 ? 32 : 16;
    if (rows <= 16)
      return;
    // Four warps where the rows are fewer: the rest split the keys.
    c.warpsM = rows / 16;
    c.warpsN = std::clamp<int64_t>(4 / c.warpsM, 1, c.keyTile / 16);
  }

  void runOnOperation() override {
    if (!isFlashTileOrDefault(queryRows) || !isFlashTileOrDefault(selectRows) ||
        !isFlashTileOrDefault(selectedRows) || !isFlashTileOrDefault(kvTile) ||
        !isFlashStageCount(stages)) {
      getOperation().emitError(
          "nsa-flash-attention: query-rows, select-rows, selected-rows and "
          "kv-tile must be 0 or multiples of 16 in 16..128, stages 2..4; "
          "found ")
          << static_cast<int64_t>(queryRows) << ", "
          << static_cast<int64_t>(selectRows) << ", "
          << static_cast<int64_t>(selectedRows) << ", "
          << static_cast<int64_t>(kvTile) << ", "
          << static_cast<int64_t>(stages);
      return signalPassFailure();
    }
    if (!isFlashTileOrDefault(gradKeyTile)) {
      getOperation().emitError("nsa-flash-attention: grad-key-tile must be 0 "
                               "or a multiple of 16 in 16..128, found ")
          << static_cast<int64_t>(gradKeyTile);
      return signalPassFailure();
    }
    if (gradChunkTokens < 0 || gradChunkTokens % 256) {
      getOperation().emitError("nsa-flash-attention: grad-chunk-tokens must "
                               "be 0 or a positive multiple of 256, found ")
          << static_cast<int64_t>(gradChunkTokens);
      return signalPassFailure();
    }
    if (!isSelectedOrder(selectedOrder)) {
      getOperation().emitError("nsa-flash-attention: selected-order is auto, "
                               "token or block, found '")
          << selectedOrder << "'";
      return signalPassFailure();
    }
    for (const std::string &op : ops)
      if (op != "compress" && op != "window" && op != "compressed" &&
          op != "select" && op != "selected" && op != "combine" &&
          op != "decode") {
        getOperation().emitError("nsa-flash-attention: ops are compress, "
                                 "window, compressed, select, selected, "
                                 "combine and decode, found '")
            << op << "'";
        return signalPassFailure();
      }
    if (decodeChunkKeys != 64 && decodeChunkKeys != 128) {
      getOperation().emitError("nsa-flash-attention: decode-chunk-keys must "
                               "be 64 or 128, found ")
          << static_cast<int64_t>(decodeChunkKeys);
      return signalPassFailure();
    }
    if (decodeClusterBlocks < 0 || decodeClusterBlocks == 1 ||
        decodeClusterBlocks > 16) {
      getOperation().emitError("nsa-flash-attention: decode-cluster-blocks "
                               "must be 0 or 2 to 16, found ")
          << static_cast<int64_t>(decodeClusterBlocks);
      return signalPassFailure();
    }
    if (decodeTargetBlocks < 1) {
      getOperation().emitError("nsa-flash-attention: decode-target-blocks "
                               "must be positive, found ")
          << static_cast<int64_t>(decodeTargetBlocks);
      return signalPassFailure();
    }
    // (Branch ops may come here without nsa-decompose or nsa-tile.)
    if (failed(checkSupportedSizes(getOperation())))
      return signalPassFailure();
    count = 0;
    appendLaunches.clear();
    zeroedDq.clear();
    givenDelta.clear();
    // Decoding steps first: the compressed caches' appends (the step's ops
    // then read the appended caches' buffers), then the step's ops, which
    // go together.
    SmallVector<CompressAppendOp> appends;
    getOperation().walk([&](CompressAppendOp op) { appends.push_back(op); });
    takeCompressAppends(appends);
    SmallVector<CombineOp> combines;
    getOperation().walk([&](CombineOp op) { combines.push_back(op); });
    llvm::SmallPtrSet<Operation *, 8> decoded;
    for (CombineOp combine : combines)
      takeDecode(combine, decoded);
    SmallVector<Operation *> branches;
    getOperation().walk([&](Operation *op) {
      if (isa<CompressOp, WindowAttentionOp, CompressedAttentionOp,
              SelectBlocksOp, SelectedAttentionOp, CombineOp, CombineGradOp,
              WindowAttentionGradOp, CompressedAttentionGradOp,
              SelectedAttentionGradOp>(op))
        branches.push_back(op);
    });
    llvm::SmallPtrSet<Operation *, 4> fused; // combines taken by a window
    for (Operation *op : branches) {
      if (fused.contains(op))
        continue;
      // Decoding's branch ops (Spec section 12) outside a step that
      // takeDecode took.
      Value kvLens = TypeSwitch<Operation *, Value>(op)
                         .Case<WindowAttentionOp, CompressedAttentionOp,
                               SelectBlocksOp, SelectedAttentionOp>(
                             [](auto branch) { return branch.getKvLens(); })
                         .Default([](Operation *) { return Value(); });
      if (kvLens) {
        leave(op, "decoding (kv_lens) outside a decoding step the decode "
                  "kernels take");
        continue;
      }
      FlashConfig c;
      c.stages = stages;
      if (auto compress = dyn_cast<CompressOp>(op)) {
        takeCompress(compress);
      } else if (auto combine = dyn_cast<CombineOp>(op)) {
        takeCombine(combine);
      } else if (auto combineGrad = dyn_cast<CombineGradOp>(op)) {
        takeCombineGrad(combineGrad);
      } else if (auto w = dyn_cast<WindowAttentionOp>(op)) {
        c.keys = FlashKeys::Window;
        c.window = w.getWindow();
        c.scale = w.getScale().convertToDouble();
        if (CombineOp combine = fusableCombine(w)) {
          // (Where the window kernel declines, accepts has said why and
          // the combine gets its own kernel.)
          Operation *combineOp = combine;
          if (takeWindowCombined(w, combine, c))
            fused.insert(combineOp);
          continue;
        }
        take(op, c, w.getQuery(), w.getKey(), w.getValue(), {},
             w.getCuSeqlens(), "window_attention");
      } else if (auto a = dyn_cast<CompressedAttentionOp>(op)) {
        c.keys = FlashKeys::Compressed;
        c.cmpBlock = a.getBlock();
        c.cmpStride = a.getStride();
        c.scale = a.getScale().convertToDouble();
        take(op, c, a.getQuery(), a.getKey(), a.getValue(), {},
             a.getCuSeqlens(), "compressed_attention");
      } else if (auto sel = dyn_cast<SelectBlocksOp>(op)) {
        // One token's G heads per warp (padded to its 16 rows for G < 16:
        // the same cost per token as G = 16): the group's score sum
        // (Eq. 10) stays in the warp, whose lanes hold its running top-n.
        c.keys = FlashKeys::Compressed;
        c.select = true;
        // Two warpgroups share each key tile: the ranking between tiles
        // overlaps better (docs/Benchmarks.md, the variants).
        c.warpsM = (selectRows ? selectRows : sm90 ? 128 : 64) / 16;
        // kv-tile is for attention: the score sums over a tile's 16 rows
        // take 64 compressed blocks (8 accumulator tiles).
        c.keyTile = 64;
        c.cmpBlock = sel.getCmpBlock();
        c.cmpStride = sel.getCmpStride();
        c.slcBlock = sel.getSlcBlock();
        c.numSelected = sel.getNumSelected();
        c.backbone = sel.getBackbone().getSpec();
        c.scale = sel.getScale().convertToDouble();
        takeSelect(sel, c);
      } else if (auto g = dyn_cast<WindowAttentionGradOp>(op)) {
        FlashGradConfig gc;
        gc.keys = FlashKeys::Window;
        gc.window = g.getWindow();
        gc.scale = g.getScale().convertToDouble();
        takeGrad(g, gc, "window_attention_grad");
      } else if (auto g = dyn_cast<CompressedAttentionGradOp>(op)) {
        FlashGradConfig gc;
        gc.keys = FlashKeys::Compressed;
        gc.cmpBlock = g.getBlock();
        gc.cmpStride = g.getStride();
        gc.scale = g.getScale().convertToDouble();
        takeGrad(g, gc, "compressed_attention_grad");
      } else if (auto g = dyn_cast<SelectedAttentionGradOp>(op)) {
        FlashGradConfig gc;
        gc.keys = FlashKeys::Selected;
        gc.slcBlock = g.getBlock();
        gc.numSlots =
            cast<RankedTensorType>(g.getIndices().getType()).getDimSize(3);
        gc.scale = g.getScale().convertToDouble();
        // A block of keys a tile, a warp per 16 of them: dk, dv per block;
        // dq per 16 rows (the G heads of 16 / G tokens).
        gc.keyWarps = gc.queryWarps = gc.slcBlock / 16;
        gc.queryKeyTile = gc.slcBlock;
        if (ShapedType::isDynamic(gc.numSlots))
          leave(op, "a dynamic number of selected blocks");
        else
          takeGrad(g, gc, "selected_attention_grad");
      } else if (auto s = dyn_cast<SelectedAttentionOp>(op)) {
        // 16 rows (the G heads of 16 / G tokens) per block; its warps split
        // each selected block's keys, 16 each, up to 4 warps.
        c.keys = FlashKeys::Selected;
        c.slcBlock = s.getBlock();
        c.numSlots =
            cast<RankedTensorType>(s.getIndices().getType()).getDimSize(3);
        c.scale = s.getScale().convertToDouble();
        // (chooseSelectedRows may take more rows: G a multiple of 16.)
        c.keyTile = c.slcBlock;
        c.warpsM = 1;
        c.warpsN = std::clamp<int64_t>(c.slcBlock / 16, 1, 4);
        if (ShapedType::isDynamic(c.numSlots)) {
          leave(op, "a dynamic number of selected blocks");
          continue;
        }
        if (takeBlockMajor(s, c))
          continue;
        take(op, c, s.getQuery(), s.getKey(), s.getValue(), s.getIndices(),
             s.getCuSeqlens(), "selected_attention");
      }
    }
  }
};

} // namespace
