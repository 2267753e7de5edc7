//===- CApiTest.cpp - libNSA-C: #nsa.config, pipelines, errors -------------===//
//
// The C API as a C caller sees it (only NSA-c/ and mlir-c/ headers): the
// #nsa.config builder against the Spec's rules, reading fields back, the
// generated pass C API, the pipeline builders' refusals, and the one error
// convention of NSA-c/Error.h across libraries.
//
//===----------------------------------------------------------------------===//

#include "NSA-c/Dialects.h"
#include "NSA-c/Error.h"
#include "NSA-c/Passes.h"
#include "NSA-c/Reference.h"

#include "mlir-c/BuiltinAttributes.h"
#include "mlir-c/IR.h"
#include "mlir-c/Pass.h"
#include "mlir-c/Transforms.h"

#include <gtest/gtest.h>

#include <string>

namespace {

class CApi : public ::testing::Test {
protected:
  void SetUp() override {
    MlirDialectRegistry registry = mlirDialectRegistryCreate();
    nsaRegisterPipelineDialects(registry);
    ctx = mlirContextCreateWithRegistry(registry, false);
    mlirDialectRegistryDestroy(registry);
    mlirDialectHandleLoadDialect(mlirGetDialectHandle__nsa__(), ctx);
  }
  void TearDown() override { mlirContextDestroy(ctx); }

  /// nsaConfigAttrGet of `c`, expected to fail with `reason` in the error.
  void expectRefused(const nsaLayerConfig &c, const std::string &reason) {
    MlirAttribute attr = nsaConfigAttrGet(ctx, &c, 0);
    EXPECT_TRUE(mlirAttributeIsNull(attr));
    std::string error = nsaGetLastError();
    EXPECT_NE(error.find("nsaConfigAttrGet: "), std::string::npos) << error;
    EXPECT_NE(error.find(reason), std::string::npos) << error;
  }

  MlirContext ctx;
  nsaLayerConfig paper = nsaPaperLayerDesc(64, 4, 192, 128).config;
};

TEST_F(CApi, PaperConfigEqualsItsText) {
  MlirAttribute built = nsaConfigAttrGet(ctx, &paper, 0);
  ASSERT_FALSE(mlirAttributeIsNull(built)) << nsaGetLastError();
  EXPECT_STREQ(nsaGetLastError(), "");
  EXPECT_TRUE(nsaAttributeIsAConfig(built));
  // The textual form without `backbone` is the paper's, as in C.
  MlirAttribute text = mlirAttributeParseGet(
      ctx, mlirStringRefCreateFromCString(
               "#nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, "
               "num_selected = 16, window = 512>"));
  EXPECT_TRUE(mlirAttributeEqual(built, text));
  EXPECT_EQ(nsaConfigAttrGetMaxHops(built), 0);
}

TEST_F(CApi, FieldsRoundTrip) {
  int64_t blocks[] = {3, 13};
  nsaLayerConfig c = paper;
  c.scale = 0.125;
  c.linearPool = 1;
  c.logLevels = 4;
  c.blocks = blocks;
  c.numBlocks = 2;
  c.maxTokens = 4096;
  MlirAttribute attr = nsaConfigAttrGet(ctx, &c, 0);
  ASSERT_FALSE(mlirAttributeIsNull(attr)) << nsaGetLastError();
  nsaLayerConfig read;
  ASSERT_TRUE(mlirLogicalResultIsSuccess(nsaConfigAttrGetFields(attr, &read)));
  EXPECT_EQ(read.cmpBlock, 32);
  EXPECT_EQ(read.cmpStride, 16);
  EXPECT_EQ(read.slcBlock, 64);
  EXPECT_EQ(read.numSelected, 16);
  EXPECT_EQ(read.window, 512);
  EXPECT_EQ(read.scale, 0.125);
  EXPECT_EQ(read.linearPool, 1);
  EXPECT_EQ(read.initialBlocks, 1);
  EXPECT_EQ(read.localBlocks, 2);
  EXPECT_EQ(read.logLevels, 4);
  EXPECT_EQ(read.hubStride, 0);
  ASSERT_EQ(read.numBlocks, 2);
  EXPECT_EQ(read.blocks[0], 3);
  EXPECT_EQ(read.blocks[1], 13);
  EXPECT_EQ(read.maxTokens, 4096);
  EXPECT_EQ(read.reserved, 0);
  // Built again from what was read: the same attribute.
  EXPECT_TRUE(mlirAttributeEqual(nsaConfigAttrGet(ctx, &read, 0), attr));
}

TEST_F(CApi, ConfigRefusedWithTheSpecsReason) {
  // One field of the paper's config changed, and the reason it is refused.
  static int64_t unordered[] = {5, 2};
  const std::pair<void (*)(nsaLayerConfig &), const char *> cases[] = {
      {[](nsaLayerConfig &c) { c.cmpStride = 48; },
       "cmp_stride (d = 48) must divide cmp_block (l = 32)"},
      {[](nsaLayerConfig &c) { c.cmpBlock = 128; },
       "must not exceed slc_block"},
      {[](nsaLayerConfig &c) { c.numSelected = 2; },
       "must be at least the number of forced blocks (3)"},
      {[](nsaLayerConfig &c) { c.window = 0; }, "window must be positive"},
      {[](nsaLayerConfig &c) { c.scale = 1e300; }, // not finite in f32
       "scale must be positive and finite"},
      {[](nsaLayerConfig &c) { c.scale = -1.0; }, "scale must be 0"},
      {[](nsaLayerConfig &c) { c.hubStride = 8; }, "declare max_tokens"},
      {[](nsaLayerConfig &c) { c.reserved = 1; }, "reserved must be 0"},
      {[](nsaLayerConfig &c) { c.numBlocks = 2; }, // blocks is NULL
       "blocks must hold numBlocks"},
      {[](nsaLayerConfig &c) {
         c.numBlocks = 2;
         c.blocks = unordered;
       },
       "increasing"},
  };
  for (auto [change, reason] : cases) {
    nsaLayerConfig c = paper;
    change(c);
    expectRefused(c, reason);
  }
  EXPECT_TRUE(mlirAttributeIsNull(nsaConfigAttrGet(ctx, nullptr, 0)));
  EXPECT_NE(std::string(nsaGetLastError()).find("the config is null"),
            std::string::npos);
  EXPECT_TRUE(
      mlirAttributeIsNull(nsaConfigAttrGet(MlirContext{nullptr}, &paper, 0)));
  // max_hops is checked against the exact hop bound.
  nsaLayerConfig c = paper;
  c.maxTokens = 65536;
  EXPECT_TRUE(mlirAttributeIsNull(nsaConfigAttrGet(ctx, &c, 1)));
  EXPECT_NE(std::string(nsaGetLastError()).find("more than max_hops = 1"),
            std::string::npos)
      << nsaGetLastError();
}

TEST_F(CApi, FieldsOfOtherAttributesRefused) {
  nsaLayerConfig read;
  MlirAttribute unit = mlirUnitAttrGet(ctx);
  EXPECT_FALSE(nsaAttributeIsAConfig(unit));
  EXPECT_TRUE(mlirLogicalResultIsFailure(nsaConfigAttrGetFields(unit, &read)));
  EXPECT_STREQ(nsaGetLastError(), "nsaConfigAttrGetFields: not an #nsa.config");
  EXPECT_EQ(nsaConfigAttrGetMaxHops(unit), -1);
  EXPECT_FALSE(nsaAttributeIsAConfig(MlirAttribute{nullptr}));
}

TEST_F(CApi, PipelineBuildersRefuseWithAReason) {
  MlirPassManager pm = mlirPassManagerCreate(ctx);
  MlirOpPassManager opm = mlirPassManagerGetAsOpPassManager(pm);
  EXPECT_TRUE(mlirLogicalResultIsFailure(nsaBuildToPTXPipeline(
      opm, mlirStringRefCreateFromCString("chip=sm_12"))));
  std::string error = nsaGetLastError();
  EXPECT_EQ(error.rfind("nsaBuildToPTXPipeline: ", 0), 0u) << error;
  EXPECT_NE(error.find("sm_12"), std::string::npos) << error;
  // Options that do not parse: the text is named, and the parser's own
  // detail where MLIR hands it back (an unknown option).
  EXPECT_TRUE(mlirLogicalResultIsFailure(nsaBuildToCPUPipeline(
      opm, mlirStringRefCreateFromCString("query-tile=abc"))));
  error = nsaGetLastError();
  EXPECT_NE(error.find("invalid pipeline options 'query-tile=abc'"),
            std::string::npos)
      << error;
  EXPECT_TRUE(mlirLogicalResultIsFailure(nsaBuildToCPUPipeline(
      opm, mlirStringRefCreateFromCString("tile-size=3"))));
  error = nsaGetLastError();
  EXPECT_NE(error.find("no such option tile-size"), std::string::npos)
      << error;
  EXPECT_TRUE(mlirLogicalResultIsFailure(nsaBuildToCPUPipeline(
      MlirOpPassManager{nullptr}, mlirStringRefCreateFromCString(""))));
  EXPECT_STREQ(nsaGetLastError(),
               "nsaBuildToCPUPipeline: the pass manager is null");
  EXPECT_TRUE(mlirLogicalResultIsSuccess(nsaBuildToPTXPipeline(
      opm, mlirStringRefCreateFromCString("format=isa"))));
  EXPECT_STREQ(nsaGetLastError(), "");
  mlirPassManagerDestroy(pm);
  nsaRegisterPipelineDialects(MlirDialectRegistry{nullptr}); // ignored
}

TEST_F(CApi, GeneratedPassesAndCanonicalizeByName) {
  mlirRegisterNSAPasses();
  nsaRegisterPipelines();
  mlirRegisterTransformsPasses();
  MlirModule module = mlirModuleCreateParse(
      ctx, mlirStringRefCreateFromCString(R"mlir(
func.func @f(%q: tensor<1x?x4x16xf32>, %k: tensor<1x?x2x16xf32>,
             %v: tensor<1x?x2x16xf32>, %g: tensor<1x?x4x3xf32>)
    -> tensor<1x?x4x16xf32> {
  %o = nsa.sparse_attention %q, %k, %v, %g {config = #nsa.config<
         cmp_block = 8, cmp_stride = 4, slc_block = 16, num_selected = 3,
         window = 16>}
     : (tensor<1x?x4x16xf32>, tensor<1x?x2x16xf32>, tensor<1x?x2x16xf32>,
        tensor<1x?x4x3xf32>) -> tensor<1x?x4x16xf32>
  return %o : tensor<1x?x4x16xf32>
})mlir"));
  ASSERT_FALSE(mlirModuleIsNull(module));
  MlirPassManager pm = mlirPassManagerCreate(ctx);
  MlirOpPassManager opm = mlirPassManagerGetAsOpPassManager(pm);
  std::string parseErrors;
  auto collect = [](MlirStringRef s, void *data) {
    static_cast<std::string *>(data)->append(s.data, s.length);
  };
  ASSERT_TRUE(mlirLogicalResultIsSuccess(mlirParsePassPipeline(
      opm,
      mlirStringRefCreateFromCString(
          "builtin.module(nsa-decompose, canonicalize, cse, nsa-to-cpu)"),
      collect, &parseErrors)))
      << parseErrors;
  mlirOpPassManagerAddOwnedPass(opm, mlirCreateNSAVerifyDialects());
  EXPECT_TRUE(mlirLogicalResultIsSuccess(
      mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module))));
  std::string text;
  mlirOperationPrint(mlirModuleGetOperation(module), collect, &text);
  EXPECT_NE(text.find("llvm.func @f"), std::string::npos);
  EXPECT_EQ(text.find("nsa."), std::string::npos);
  mlirPassManagerDestroy(pm);
  mlirModuleDestroy(module);
}

TEST(ErrorConvention, OneMessageAcrossLibraries) {
  // libnsa_reference fails; the same nsaGetLastError() that libNSA-C
  // writes reads it.
  nsaLayerDesc desc = nsaPaperLayerDesc(64, 4, 192, 128);
  desc.qHeads = 6; // not a multiple of the 4 KV heads
  double x = 0;
  EXPECT_NE(nsaReferenceForward(&desc, 1, 1, &x, &x, &x, &x, nullptr, nullptr,
                                0, &x, nullptr),
            0);
  std::string error = nsaGetLastError();
  EXPECT_EQ(error.rfind("nsaReferenceForward: ", 0), 0u) << error;
  nsaSetLastError(nullptr);
  EXPECT_STREQ(nsaGetLastError(), "");
}

} // namespace
