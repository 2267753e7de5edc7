//===- Wgmma.cpp - warpgroup tensor-core instructions (sm_90a) ------------===//

#include "Wgmma.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

#include <string>

using namespace mlir;
using namespace mlir::nsa::detail;

namespace {

/// One inline-asm statement with side effects. `values` are read and
/// returned after `inputs`, which are read only and follow them in the
/// operand numbering; `tied`: in the same registers, else in new ones
/// (outputs $0.., values read as $n..). Returns the new `values`.
SmallVector<Value> emitAsm(OpBuilder &b, Location loc, StringRef text,
                           ValueRange values, ValueRange inputs,
                           ArrayRef<StringRef> inputConstraints,
                           bool tied = true) {
  MLIRContext *ctx = b.getContext();
  auto letter = [](Type t) { return t.isF32() ? "f" : "r"; };
  std::string constraints;
  auto add = [&](const Twine &c) {
    if (!constraints.empty())
      constraints += ",";
    constraints += c.str();
  };
  SmallVector<Type> types;
  for (Value v : values) {
    add(Twine("=") + letter(v.getType()));
    types.push_back(v.getType());
  }
  for (size_t i = 0; i < values.size(); ++i)
    add(tied ? Twine(i) : Twine(letter(values[i].getType())));
  for (StringRef c : inputConstraints)
    add(c);
  add("~{memory}");
  SmallVector<Value> operands(values);
  operands.append(inputs.begin(), inputs.end());
  Type result = types.empty() ? LLVM::LLVMVoidType::get(ctx)
                : types.size() == 1
                    ? types.front()
                    : LLVM::LLVMStructType::getLiteral(ctx, types);
  auto op = LLVM::InlineAsmOp::create(
      b, loc, types.empty() ? TypeRange{} : TypeRange{result}, operands,
      b.getStringAttr(text), b.getStringAttr(constraints), b.getUnitAttr(),
      UnitAttr(),
      LLVM::TailCallKindAttr::get(ctx, LLVM::tailcallkind::TailCallKind::None),
      LLVM::AsmDialectAttr(), ArrayAttr());
  if (types.size() <= 1)
    return SmallVector<Value>(op->getResults());
  SmallVector<Value> out;
  for (size_t i = 0; i < types.size(); ++i)
    out.push_back(LLVM::ExtractValueOp::create(b, loc, op.getResult(0),
                                               ArrayRef<int64_t>{(int64_t)i}));
  return out;
}

/// "{$first, ..., $(first + count - 1)}"
std::string registerList(int64_t first, int64_t count) {
  std::string s = "{";
  for (int64_t i = 0; i < count; ++i)
    s += (i ? ", $" : "$") + std::to_string(first + i);
  return s + "}";
}

Value i32(OpBuilder &b, Location loc, int64_t v) {
  return arith::ConstantIntOp::create(b, loc, b.getI32Type(), v);
}

} // namespace

WgmmaDesc mlir::nsa::detail::wgmmaDescriptor(OpBuilder &b, Location loc,
                                             Value address,
                                             int64_t leadingBytes,
                                             int64_t strideBytes) {
  // Bits 0-13 start address >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 62-63
  // the layout (1: 128-byte swizzle); the base offset (49-51) is 0 for
  // tiles whose pattern starts 1024-byte aligned.
  uint64_t fixed = (uint64_t(leadingBytes >> 4) & 0x3fff) << 16 |
                   (uint64_t(strideBytes >> 4) & 0x3fff) << 32 |
                   uint64_t(1) << 62;
  Type i64 = b.getI64Type();
  Value addr = arith::ExtUIOp::create(b, loc, i64, address);
  Value start = arith::AndIOp::create(
      b, loc,
      arith::ShRUIOp::create(b, loc, addr,
                             arith::ConstantIntOp::create(b, loc, i64, 4)),
      arith::ConstantIntOp::create(b, loc, i64, 0x3fff));
  return {arith::OrIOp::create(
      b, loc, start, arith::ConstantIntOp::create(b, loc, i64, fixed))};
}

WgmmaDesc mlir::nsa::detail::wgmmaAdvance(WgmmaDesc desc, int64_t bytes) {
  assert(bytes % 16 == 0 && "descriptors address 16-byte units");
  desc.offset += bytes >> 4;
  return desc;
}

WgmmaDesc mlir::nsa::detail::wgmmaMaterialize(OpBuilder &b, Location loc,
                                              WgmmaDesc desc) {
  if (desc.offset == 0)
    return desc;
  return {arith::AddIOp::create(
      b, loc, desc.base,
      arith::ConstantIntOp::create(b, loc, b.getI64Type(), desc.offset))};
}

/// The PTX operand of descriptor `desc` passed as `$index`: the operand
/// itself, or `name` after the offset is added to it.
static std::string descriptorPTX(std::string &text, StringRef name,
                                 WgmmaDesc desc, int64_t index) {
  std::string operand = "$" + std::to_string(index);
  if (desc.offset == 0)
    return operand;
  text += (".reg .b64 " + name + ";\nadd.s64 " + name + ", " + operand + ", " +
           Twine(desc.offset) + ";\n")
              .str();
  return name.str();
}

SmallVector<Value> mlir::nsa::detail::wgmmaSS(OpBuilder &b, Location loc,
                                              int64_t n, WgmmaDesc descA,
                                              WgmmaDesc descB, ValueRange acc,
                                              bool accumulate, bool transA) {
  int64_t k = acc.size();
  assert(k == n / 2 && "one f32 per two columns");
  std::string text = "{\n.reg .pred p;\n";
  std::string a = descriptorPTX(text, "da", descA, 2 * k);
  std::string d = descriptorPTX(text, "db", descB, 2 * k + 1);
  text += "setp.ne.b32 p, $" + std::to_string(2 * k + 2) +
          ", 0;\nwgmma.mma_async.sync.aligned.m64n" + std::to_string(n) +
          "k16.f32.bf16.bf16 " + registerList(0, k) + ", " + a + ", " + d +
          ", p, 1, 1, " + (transA ? "1" : "0") + ", 0;\n}";
  return emitAsm(b, loc, text, acc,
                 {descA.base, descB.base, i32(b, loc, accumulate ? 1 : 0)},
                 {"l", "l", "r"});
}

SmallVector<Value> mlir::nsa::detail::wgmmaRS(OpBuilder &b, Location loc,
                                              int64_t n, ValueRange a,
                                              WgmmaDesc descB, bool transB,
                                              ValueRange acc) {
  int64_t k = acc.size();
  assert(k == n / 2 && a.size() == 4 && "fragment sizes");
  std::string text = "{\n.reg .pred p;\n";
  std::string d = descriptorPTX(text, "db", descB, 2 * k + 4);
  text += "setp.ne.b32 p, $" + std::to_string(2 * k + 5) +
          ", 0;\nwgmma.mma_async.sync.aligned.m64n" + std::to_string(n) +
          "k16.f32.bf16.bf16 " + registerList(0, k) + ", " +
          registerList(2 * k, 4) + ", " + d + ", p, 1, 1, " +
          (transB ? "1" : "0") + ";\n}";
  SmallVector<Value> inputs(a);
  inputs.append({descB.base, i32(b, loc, 1)});
  return emitAsm(b, loc, text, acc, inputs, {"r", "r", "r", "r", "l", "r"});
}

SmallVector<Value> mlir::nsa::detail::wgmmaChainSS(
    OpBuilder &b, Location loc, int64_t n, WgmmaDesc descA, int64_t aRows,
    WgmmaDesc descB, int64_t bRows, int64_t kDim, ValueRange acc,
    bool accumulate, bool materializeA) {
  // A k16 step moves 32 bytes within a 64-column block.
  SmallVector<Value> out(acc);
  for (int64_t kk = 0; kk < kDim / 16; ++kk) {
    int64_t inBlock = (kk % 4) * 32, blk = kk / 4;
    WgmmaDesc a =
        wgmmaAdvance(descA, blk * aRows * kSwizzleRowBytes + inBlock);
    if (materializeA)
      a = wgmmaMaterialize(b, loc, a);
    out = wgmmaSS(
        b, loc, n, a,
        wgmmaMaterialize(
            b, loc,
            wgmmaAdvance(descB, blk * bRows * kSwizzleRowBytes + inBlock)),
        out, /*accumulate=*/accumulate || kk > 0);
  }
  return out;
}

SmallVector<Value> mlir::nsa::detail::wgmmaChainRS(OpBuilder &b, Location loc,
                                                   int64_t n, ArrayRef<Value> a,
                                                   WgmmaDesc descB,
                                                   ValueRange acc) {
  // A k16 step is 16 rows of B.
  SmallVector<Value> out(acc);
  for (size_t kk = 0; kk < a.size() / 4; ++kk)
    out = wgmmaRS(b, loc, n, a.slice(4 * kk, 4),
                  wgmmaMaterialize(b, loc,
                                   wgmmaAdvance(descB, static_cast<int64_t>(kk) *
                                                           16 *
                                                           kSwizzleRowBytes)),
                  /*transB=*/true, out);
  return out;
}

SmallVector<Value> mlir::nsa::detail::wgmmaFence(OpBuilder &b, Location loc,
                                                 ValueRange values) {
  return emitAsm(b, loc, "wgmma.fence.sync.aligned;", values, {}, {});
}

void mlir::nsa::detail::wgmmaCommit(OpBuilder &b, Location loc) {
  emitAsm(b, loc, "wgmma.commit_group.sync.aligned;", {}, {}, {});
}

SmallVector<Value> mlir::nsa::detail::wgmmaWaitMoved(OpBuilder &b,
                                                     Location loc,
                                                     int64_t pending,
                                                     ValueRange values) {
  std::string text =
      "wgmma.wait_group.sync.aligned " + std::to_string(pending) + ";";
  for (size_t i = 0; i < values.size(); ++i)
    text += "\nmov.b32 $" + std::to_string(i) + ", $" +
            std::to_string(values.size() + i) + ";";
  return emitAsm(b, loc, text, values, {}, {}, /*tied=*/false);
}

SmallVector<Value> mlir::nsa::detail::wgmmaWait(OpBuilder &b, Location loc,
                                                int64_t pending,
                                                ValueRange values) {
  return emitAsm(b, loc,
                 "wgmma.wait_group.sync.aligned " + std::to_string(pending) +
                     ";",
                 values, {}, {});
}

void mlir::nsa::detail::fenceProxyAsync(OpBuilder &b, Location loc) {
  emitAsm(b, loc, "fence.proxy.async.shared::cta;", {}, {}, {});
}

void mlir::nsa::detail::fenceBarrierInit(OpBuilder &b, Location loc) {
  emitAsm(b, loc, "fence.mbarrier_init.release.cluster;", {}, {}, {});
}
