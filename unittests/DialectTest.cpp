//===- DialectTest.cpp - unit tests of the nsa dialect's C++ API ----------===//
//
// Checks the spec arithmetic (include/NSA/Spec.h) against hand-computed
// values and the typed attributes through their C++ builders and parser.
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSADialect.h"
#include "NSA/Spec.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"

#include "gtest/gtest.h"

#include <cmath>
#include <string>
#include <vector>

using namespace mlir;
using namespace mlir::nsa;

namespace {

TEST(Spec, CompressedBlockCounts) {
  // l = 32, d = 16: blocks start at 0, 16, 32, ...; the last must fit.
  EXPECT_EQ(spec::numCompressedBlocks(31, 32, 16), 0);
  EXPECT_EQ(spec::numCompressedBlocks(32, 32, 16), 1);
  EXPECT_EQ(spec::numCompressedBlocks(47, 32, 16), 1);
  EXPECT_EQ(spec::numCompressedBlocks(48, 32, 16), 2);
  EXPECT_EQ(spec::numCompressedBlocks(1000, 32, 16), 61);
  // Token t sees block i when i*16 + 31 <= t.
  EXPECT_EQ(spec::numVisibleCompressedBlocks(30, 32, 16), 0);
  EXPECT_EQ(spec::numVisibleCompressedBlocks(31, 32, 16), 1);
  EXPECT_EQ(spec::numVisibleCompressedBlocks(46, 32, 16), 1);
  EXPECT_EQ(spec::numVisibleCompressedBlocks(47, 32, 16), 2);
  EXPECT_EQ(spec::numPackedCompressedRows(1000, 16), 62);
  EXPECT_EQ(spec::numSelectionBlocks(65, 64), 2);
}

TEST(Spec, OverlapWeightsMatchWorkedExample) {
  // docs/Spec.md worked example: l = 32, d = 16, l' = 64. Selection block 1
  // (tokens 64..127) receives compressed blocks 3 (1), 4..6 (2), 7 (1).
  std::vector<int64_t> w;
  for (int64_t i = 0; i < 10; ++i)
    w.push_back(spec::overlapWeight(i, 1, 32, 16, 64));
  EXPECT_EQ(w, (std::vector<int64_t>{0, 0, 0, 1, 2, 2, 2, 1, 0, 0}));
  // Every interior selection block receives (l'/d) * (l/d) = 8 in total,
  // the number of terms of the double sum of Eq. 9.
  for (int64_t j = 1; j < 20; ++j) {
    int64_t total = 0;
    for (int64_t i = 0; i < 100; ++i)
      total += spec::overlapWeight(i, j, 32, 16, 64);
    EXPECT_EQ(total, 8) << "selection block " << j;
  }
  // Block 0 misses the half of block -1 that does not exist.
  EXPECT_EQ(spec::overlapWeight(0, 0, 32, 16, 64), 2);
}

TEST(Spec, ForcedBlockPatterns) {
  auto forced = [](const spec::Backbone &b, int64_t qb) {
    std::vector<int64_t> out;
    b.forcedBlocks(qb, out);
    for (int64_t j = 0; j <= qb; ++j)
      EXPECT_EQ(b.isForced(j, qb),
                std::binary_search(out.begin(), out.end(), j))
          << "block " << j << " of query block " << qb;
    return out;
  };
  spec::Backbone log;
  log.logLevels = 4; // 1, 2, 4, 8 blocks back
  EXPECT_EQ(forced(log, 20), (std::vector<int64_t>{12, 16, 18, 19}));
  EXPECT_EQ(forced(log, 3), (std::vector<int64_t>{1, 2}));
  spec::Backbone hubs;
  hubs.hubStride = 8;
  hubs.local = 1;
  EXPECT_EQ(forced(hubs, 20), (std::vector<int64_t>{0, 8, 16, 20}));
  EXPECT_EQ(hubs.maxForcedBlocks(), -1); // grows with T
  EXPECT_EQ(hubs.maxForcedBlocks(20), 4);
  spec::Backbone list;
  list.blocks = {3, 7};
  list.initial = 1;
  EXPECT_EQ(forced(list, 5), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(list.maxForcedBlocks(), 3);
  spec::Backbone all{1, 2, 3, 0, {5}};
  // Block 9: initial 0, local 8 and 9, log 8, 7, 5 back 1, 2, 4, list 5.
  EXPECT_EQ(forced(all, 9), (std::vector<int64_t>{0, 5, 7, 8, 9}));
  // Far out: 0, c-4, c-2, c-1, c and 5 (1 back is also local).
  EXPECT_EQ(all.maxForcedBlocks(), 6);
}

TEST(Spec, ForcedBlocks) {
  spec::Backbone paper{1, 2};
  auto forced = [](const spec::Backbone &b, int64_t qb) {
    std::vector<int64_t> out;
    b.forcedBlocks(qb, out);
    return out;
  };
  EXPECT_EQ(paper.maxForcedBlocks(), 3);
  EXPECT_EQ(forced(paper, 0), (std::vector<int64_t>{0}));
  EXPECT_EQ(forced(paper, 1), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(forced(paper, 2), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(forced(paper, 7), (std::vector<int64_t>{0, 6, 7}));
  EXPECT_EQ(forced(spec::Backbone{3, 1}, 2), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(forced(spec::Backbone{0, 0}, 5), (std::vector<int64_t>{}));
  EXPECT_EQ(forced(spec::Backbone{2, 0}, 5), (std::vector<int64_t>{0, 1}));
}

class AttrTest : public ::testing::Test {
protected:
  AttrTest() { ctx.loadDialect<NSADialect>(); }

  /// Parses `text` and returns the diagnostic it produced, if any.
  std::string parseError(StringRef text) {
    std::string message;
    ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &diag) {
      message = diag.str();
      return success();
    });
    Attribute attr = parseAttribute(text, &ctx);
    EXPECT_FALSE(attr) << text.str();
    return message;
  }

  MLIRContext ctx;
};

TEST_F(AttrTest, ConfigRoundTripsAndDefaults) {
  Attribute attr = parseAttribute(
      "#nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, "
      "num_selected = 16, window = 512, backbone = <initial = 1, local = 2>>",
      &ctx);
  auto config = dyn_cast_or_null<ConfigAttr>(attr);
  ASSERT_TRUE(config);
  EXPECT_EQ(config.getCmpBlock(), 32);
  EXPECT_EQ(config.getPool(), PoolKind::Mean);
  EXPECT_EQ(config.getBackbone().getSpec().maxForcedBlocks(), 3);
  EXPECT_DOUBLE_EQ(config.getScaleOr(192), 1.0 / std::sqrt(192.0));

  std::string printed;
  llvm::raw_string_ostream os(printed);
  Attribute(config).print(os);
  EXPECT_EQ(parseAttribute(printed, &ctx), config) << printed;

  auto built = ConfigAttr::get(
      &ctx, 32, 16, 64, 16, 512, FloatAttr::get(Float32Type::get(&ctx), 0.5),
      PoolKind::Linear, BackboneAttr::get(&ctx, 1, 2, 0, 0, nullptr), 0, 0);
  EXPECT_DOUBLE_EQ(built.getScaleOr(192), 0.5);
}

TEST_F(AttrTest, ConfigVerifierRejects) {
  EXPECT_NE(parseError("#nsa.config<cmp_block = 32, cmp_stride = 12, "
                       "slc_block = 64, num_selected = 16, window = 512, "
                       "backbone = <>>")
                .find("must divide cmp_block"),
            std::string::npos);
  EXPECT_NE(parseError("#nsa.config<cmp_block = 32, cmp_stride = 16, "
                       "slc_block = 64, num_selected = 2, window = 512, "
                       "backbone = <initial = 1, local = 2>>")
                .find("at least the number of forced blocks (3)"),
            std::string::npos);
  EXPECT_NE(parseError("#nsa.backbone<initial = -1>").find("non-negative"),
            std::string::npos);
}

} // namespace
