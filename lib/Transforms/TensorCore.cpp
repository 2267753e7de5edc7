//===- TensorCore.cpp - tile contractions on tensor cores -----------------===//
//
// Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix fragments for
// mma.m16n8k16"), with g = lane / 4 and p = 2 * (lane % 4):
//   A (vector<4x2xbf16>): rows g, g + 8, g, g + 8; columns p, p, p + 8, p + 8
//   B (vector<2x2xbf16>): column g; rows p, p + 8
//   C (vector<2x2xf32>):  rows g, g + 8; columns p, p + 1
// ldmatrix gives exactly these when lane l points at row l % 16, column
// 8 * (l / 16) of A's 16 x 16 tile, and (without transposition, B stored
// [n][k]) at row l % 8 + 8 * (l / 16), column 8 * ((l / 8) % 2) of the
// 16 x 16 slab of B^T that two neighbouring 8-column tiles need, or (with
// transposition, B stored [k][n]) at row l % 16, column 8 * (l / 16) of B.
//
//===----------------------------------------------------------------------===//

#include "NSA/Transforms/TensorCore.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

using namespace mlir;
using namespace mlir::nsa::detail;

namespace {

/// Output tiles (8 columns each) a warp keeps in registers at most: 16 of
/// them are 64 f32 accumulators per thread.
constexpr int64_t kMaxTilesPerWarp = 16;

/// Index arithmetic at the builder's insertion point.
struct Index {
  OpBuilder &b;
  Location loc;
  Value c(int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); }
  Value add(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value add(Value x, int64_t y) { return y ? add(x, c(y)) : x; }
  Value mul(Value x, int64_t y) {
    return arith::MulIOp::create(b, loc, x, c(y));
  }
  Value div(Value x, int64_t y) {
    return arith::DivUIOp::create(b, loc, x, c(y));
  }
  Value rem(Value x, int64_t y) {
    return arith::RemUIOp::create(b, loc, x, c(y));
  }
};

/// `v` as a memref in shared memory, for ldmatrix: when it is a view of a
/// tile buffer of the launch (which nsa-map-to-gpu places in shared memory)
/// whose rows start 16 bytes apart and at 16-byte boundaries. Null
/// otherwise.
Value sharedView(OpBuilder &b, Location loc, Value v) {
  Value root = v;
  while (Operation *def = root.getDefiningOp()) {
    if (isa<memref::AllocOp>(def))
      break;
    auto view = dyn_cast<ViewLikeOpInterface>(def);
    if (!view)
      return {};
    root = view.getViewSource();
  }
  auto alloc = root.getDefiningOp<memref::AllocOp>();
  if (!alloc || !alloc->getParentOfType<gpu::LaunchOp>())
    return {};
  auto type = cast<MemRefType>(v.getType());
  SmallVector<int64_t> strides;
  int64_t offset;
  if (type.getMemorySpace() || type.getRank() != 2 ||
      failed(type.getStridesAndOffset(strides, offset)) || strides[1] != 1 ||
      ShapedType::isDynamic(strides[0]) || ShapedType::isDynamic(offset) ||
      strides[0] % 8 || offset % 8)
    return {};
  auto shared = MemRefType::get(
      type.getShape(), type.getElementType(), type.getLayout(),
      gpu::AddressSpaceAttr::get(b.getContext(),
                                 gpu::GPUDialect::getWorkgroupAddressSpace()));
  return memref::MemorySpaceCastOp::create(b, loc, shared, v);
}

/// The registers of an mma.sync operand: 32 bits each, two bf16 values
/// with the first in the low half.
using Registers = SmallVector<Value, 4>;

/// Reads the A and B fragments of one warp.
class FragmentReader {
public:
  FragmentReader(OpBuilder &b, Location loc, const Contraction &con, Value lane)
      : con(con) {
    Index ix{b, loc};
    aShared = sharedView(b, loc, con.a);
    bShared = sharedView(b, loc, con.b);
    group = ix.div(lane, 4);
    pair = ix.mul(ix.rem(lane, 4), 2);
    row16 = ix.rem(lane, 16);
    half8 = ix.mul(ix.div(lane, 16), 8);
    row8 = ix.rem(lane, 8);
    k8 = ix.mul(ix.rem(ix.div(lane, 8), 2), 8);
  }

  /// The A fragment (4 registers) of rows [m0, m0 + 16), columns
  /// [k0, k0 + 16).
  Registers a(Index ix, Value m0, Value k0) {
    if (aShared)
      return unpackLdMatrix(ix.b, ix.loc,
                    nvgpu::LdMatrixOp::create(
                        ix.b, ix.loc,
                        VectorType::get({4, 2}, ix.b.getBF16Type()), aShared,
                        ValueRange{ix.add(m0, row16), ix.add(k0, half8)},
                        /*transpose=*/false, /*numTiles=*/4),
                    0, 4);
    Value r = ix.add(m0, group), k = ix.add(k0, pair);
    Registers regs;
    for (auto [dr, dk] :
         {std::pair<int64_t, int64_t>{0, 0}, {8, 0}, {0, 8}, {8, 8}}) {
      auto load = [&](int64_t i) -> Value {
        return memref::LoadOp::create(
            ix.b, ix.loc, con.a, ValueRange{ix.add(r, dr), ix.add(k, dk + i)});
      };
      regs.push_back(packBF16(ix.b, ix.loc, load(0), load(1)));
    }
    return regs;
  }

  /// The B fragments (2 registers each) of the `tiles` 8-column tiles from
  /// column n0, rows [k0, k0 + 16).
  SmallVector<Registers> b(Index ix, Value n0, Value k0, int64_t tiles) {
    SmallVector<Registers> frags;
    for (int64_t j = 0; j < tiles;) {
      Value n = ix.add(n0, 8 * j);
      if (!bShared) {
        Value col = ix.add(n, group), k = ix.add(k0, pair);
        auto load = [&](int64_t dk) -> Value {
          Value kk = ix.add(k, dk);
          return memref::LoadOp::create(ix.b, ix.loc, con.b,
                                        con.bTransposed ? ValueRange{col, kk}
                                                        : ValueRange{kk, col});
        };
        frags.push_back({packBF16(ix.b, ix.loc, load(0), load(1)),
                         packBF16(ix.b, ix.loc, load(8), load(9))});
        ++j;
        continue;
      }
      // Two neighbouring tiles with one ldmatrix.x4 where there are two.
      int64_t count = j + 1 < tiles ? 2 : 1;
      SmallVector<Value> idx =
          con.bTransposed
              ? SmallVector<Value>{ix.add(ix.add(n, row8),
                                          count == 2 ? half8 : ix.c(0)),
                                   ix.add(k0, k8)}
              : SmallVector<Value>{ix.add(k0, row16),
                                   count == 2 ? ix.add(n, half8) : n};
      Value loaded = nvgpu::LdMatrixOp::create(
          ix.b, ix.loc, VectorType::get({2 * count, 2}, ix.b.getBF16Type()),
          bShared, idx, /*transpose=*/!con.bTransposed,
          /*numTiles=*/2 * count);
      for (int64_t t = 0; t < count; ++t)
        frags.push_back(unpackLdMatrix(ix.b, ix.loc, loaded, 2 * t, 2));
      j += count;
    }
    return frags;
  }

  Value group, pair;

private:
  const Contraction &con;
  Value aShared, bShared;
  Value row16, half8, row8, k8;
};

} // namespace

Value mlir::nsa::detail::packBF16(OpBuilder &b, Location loc, Value lo,
                                 Value hi) {
  Type i32 = b.getI32Type();
  auto bits = [&](Value v) -> Value {
    return arith::ExtUIOp::create(
        b, loc, i32, arith::BitcastOp::create(b, loc, b.getI16Type(), v));
  };
  Value high = arith::ShLIOp::create(
      b, loc, bits(hi),
      arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(16)));
  return arith::OrIOp::create(b, loc, bits(lo), high);
}

Value mlir::nsa::detail::truncPackBF16(OpBuilder &b, Location loc, Value lo,
                                       Value hi) {
  Value pair = vector::FromElementsOp::create(
      b, loc, VectorType::get({2}, b.getF32Type()), ValueRange{lo, hi});
  Value rounded = arith::TruncFOp::create(
      b, loc, VectorType::get({2}, b.getBF16Type()), pair);
  Value word = vector::BitCastOp::create(
      b, loc, VectorType::get({1}, b.getI32Type()), rounded);
  return vector::ExtractOp::create(b, loc, word, ArrayRef<int64_t>{0});
}

SmallVector<Value, 4> mlir::nsa::detail::unpackLdMatrix(OpBuilder &b,
                                                        Location loc,
                                                        Value loaded,
                                                        int64_t first,
                                                        int64_t count) {
  SmallVector<Value, 4> regs;
  auto word = VectorType::get({1}, b.getI32Type());
  for (int64_t i = first; i < first + count; ++i) {
    Value row = vector::ExtractOp::create(b, loc, loaded, ArrayRef<int64_t>{i});
    Value bits = vector::BitCastOp::create(b, loc, word, row);
    regs.push_back(
        vector::ExtractOp::create(b, loc, bits, ArrayRef<int64_t>{0}));
  }
  return regs;
}

SmallVector<Value, 4> mlir::nsa::detail::mmaBF16(OpBuilder &b, Location loc,
                                                 ValueRange a, ValueRange bFrag,
                                                 ValueRange c) {
  Type f32 = b.getF32Type();
  auto resultType =
      LLVM::LLVMStructType::getLiteral(b.getContext(), {f32, f32, f32, f32});
  Value d = NVVM::MmaOp::create(
      b, loc, resultType, a, bFrag, c, ArrayRef<int64_t>{16, 8, 16},
      std::nullopt, std::nullopt,
      std::array<NVVM::MMATypes, 2>{NVVM::MMATypes::bf16, NVVM::MMATypes::bf16},
      std::array<NVVM::MMALayout, 2>{NVVM::MMALayout::row,
                                     NVVM::MMALayout::col});
  SmallVector<Value, 4> out;
  for (int64_t i = 0; i < 4; ++i)
    out.push_back(
        LLVM::ExtractValueOp::create(b, loc, d, ArrayRef<int64_t>{i}));
  return out;
}

std::optional<Contraction>
mlir::nsa::detail::matchContraction(linalg::GenericOp op) {
  if (op.getNumDpsInputs() != 2 || op.getNumDpsInits() != 1 ||
      op.getNumLoops() != 3 || op.getNumReductionLoops() != 1)
    return std::nullopt;
  Value a = op.getDpsInputOperand(0)->get(),
        b = op.getDpsInputOperand(1)->get(), c = op.getDpsInitOperand(0)->get();
  auto at = dyn_cast<MemRefType>(a.getType()),
       bt = dyn_cast<MemRefType>(b.getType()),
       ct = dyn_cast<MemRefType>(c.getType());
  if (!at || !bt || !ct || !at.getElementType().isBF16() ||
      !bt.getElementType().isBF16() || !ct.getElementType().isF32() ||
      !at.hasStaticShape() || !bt.hasStaticShape() || !ct.hasStaticShape())
    return std::nullopt;
  // Body: yield out + ext(a) * ext(b).
  Block &body = op.getRegion().front();
  auto yield = cast<linalg::YieldOp>(body.getTerminator());
  auto add = yield.getOperand(0).getDefiningOp<arith::AddFOp>();
  if (!add)
    return std::nullopt;
  Value out = body.getArgument(2);
  Value prodValue = add.getLhs() == out ? add.getRhs() : add.getLhs();
  if (add.getLhs() != out && add.getRhs() != out)
    return std::nullopt;
  auto mul = prodValue.getDefiningOp<arith::MulFOp>();
  if (!mul)
    return std::nullopt;
  auto isExt = [&](Value v, unsigned arg) {
    auto ext = v.getDefiningOp<arith::ExtFOp>();
    return ext && ext.getIn() == body.getArgument(arg);
  };
  if (!((isExt(mul.getLhs(), 0) && isExt(mul.getRhs(), 1)) ||
        (isExt(mul.getLhs(), 1) && isExt(mul.getRhs(), 0))))
    return std::nullopt;
  // Maps: C (dm, dn), A (dm, dk), B (dn, dk) or (dk, dn).
  SmallVector<AffineMap> maps = op.getIndexingMapsArray();
  auto dim = [](AffineMap map, unsigned i) -> int64_t {
    auto d = dyn_cast<AffineDimExpr>(map.getResult(i));
    return d ? static_cast<int64_t>(d.getPosition()) : -1;
  };
  if (maps[2].getNumResults() != 2 || maps[0].getNumResults() != 2 ||
      maps[1].getNumResults() != 2)
    return std::nullopt;
  int64_t dm = dim(maps[2], 0), dn = dim(maps[2], 1);
  int64_t dk = 3 - dm - dn;
  if (dm < 0 || dn < 0 || dim(maps[0], 0) != dm || dim(maps[0], 1) != dk)
    return std::nullopt;
  bool transposed;
  if (dim(maps[1], 0) == dn && dim(maps[1], 1) == dk)
    transposed = true;
  else if (dim(maps[1], 0) == dk && dim(maps[1], 1) == dn)
    transposed = false;
  else
    return std::nullopt;
  int64_t m = ct.getDimSize(0), n = ct.getDimSize(1), k = at.getDimSize(1);
  if (m % 16 || n % 8 || k % 16)
    return std::nullopt;
  return Contraction{a, b, c, m, n, k, transposed};
}

void mlir::nsa::detail::lowerToMMA(linalg::GenericOp op, const Contraction &con,
                                   Value tid, int64_t blockSize,
                                   bool zeroInit) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  Index ix{b, loc};
  int64_t warps = blockSize / 32, mTiles = con.m / 16, nTiles = con.n / 8;
  // Output tiles per warp task: as many as keep every warp busy, so that
  // each A fragment serves them all.
  int64_t strip = 1;
  for (int64_t s = std::min(nTiles, kMaxTilesPerWarp); s > 1; --s)
    if (nTiles % s == 0 && mTiles * (nTiles / s) >= warps) {
      strip = s;
      break;
    }
  int64_t stripsPerRow = nTiles / strip;
  Value warp = ix.div(tid, 32);
  FragmentReader frags(b, loc, con, ix.rem(tid, 32));
  scf::ForOp::create(
      b, loc, warp, ix.c(mTiles * stripsPerRow), ix.c(warps), ValueRange{},
      [&](OpBuilder &tb, Location, Value task, ValueRange) {
        Index tx{tb, loc};
        Value m0 = tx.mul(tx.div(task, stripsPerRow), 16);
        Value n0 = tx.mul(tx.rem(task, stripsPerRow), 8 * strip);
        Value row = tx.add(m0, frags.group), row8 = tx.add(row, 8);
        // The C elements of the strip, 4 per tile: (row, col),
        // (row, col + 1), (row + 8, col), (row + 8, col + 1).
        SmallVector<SmallVector<Value>> cIndices;
        for (int64_t j = 0; j < strip; ++j) {
          Value col = tx.add(tx.add(n0, frags.pair), 8 * j);
          Value col1 = tx.add(col, 1);
          cIndices.append({{row, col}, {row, col1}, {row8, col}, {row8, col1}});
        }
        SmallVector<Value> acc;
        Value zero = arith::ConstantOp::create(tb, loc, tb.getF32FloatAttr(0));
        for (auto &idx : cIndices)
          acc.push_back(
              zeroInit
                  ? zero
                  : memref::LoadOp::create(tb, loc, con.c, idx).getResult());
        auto kLoop = scf::ForOp::create(
            tb, loc, tx.c(0), tx.c(con.k), tx.c(16), acc,
            [&](OpBuilder &kb, Location, Value k0, ValueRange accs) {
              Index kx{kb, loc};
              Registers a = frags.a(kx, m0, k0);
              SmallVector<Registers> bs = frags.b(kx, n0, k0, strip);
              SmallVector<Value> next;
              for (auto [j, bj] : llvm::enumerate(bs))
                llvm::append_range(
                    next, mmaBF16(kb, loc, a, bj, accs.slice(4 * j, 4)));
              scf::YieldOp::create(kb, loc, next);
            });
        for (auto [i, idx] : llvm::enumerate(cIndices))
          memref::StoreOp::create(tb, loc, kLoop.getResult(i), con.c, idx);
        scf::YieldOp::create(tb, loc);
      });
  op.erase();
}
