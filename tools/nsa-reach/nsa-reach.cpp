//===- nsa-reach.cpp - hop bounds of NSA backbones -------------------------===//
//
// Prints the exact worst-case hop bound (include/NSA/Reach.h) and per-query
// cost of a backbone at given sequence lengths:
//
//   nsa-reach --initial=1 --local=2 --log-levels=15 --seq-len=65536,1048576
//   nsa-reach --table     # the pattern table of docs/Spec.md, section 11
//
//===----------------------------------------------------------------------===//

#include "NSA/Dialect/NSADialect.h"
#include "NSA/Reach.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir::nsa::spec;
namespace cl = llvm::cl;

static cl::OptionCategory category("nsa-reach options");
static cl::opt<int64_t> slcBlock("slc-block",
                                 cl::desc("l': tokens per selection block"),
                                 cl::init(64), cl::cat(category));
static cl::opt<int64_t> window("window", cl::desc("w: the sliding window"),
                               cl::init(512), cl::cat(category));
static cl::opt<int64_t> initial("initial",
                                cl::desc("always-on initial blocks"),
                                cl::init(1), cl::cat(category));
static cl::opt<int64_t> local("local",
                              cl::desc("always-on local blocks (the "
                                       "token's own and those before it)"),
                              cl::init(2), cl::cat(category));
static cl::opt<int64_t>
    logLevels("log-levels",
              cl::desc("log-spaced always-on blocks: levels (0: none)"),
              cl::init(0), cl::cat(category));
static cl::opt<int64_t>
    hubStride("hub-stride",
              cl::desc("always-on hub blocks: every this many (0: none)"),
              cl::init(0), cl::cat(category));
static cl::list<int64_t> blocks("blocks", cl::CommaSeparated,
                                cl::desc("explicit always-on blocks"),
                                cl::cat(category));
static cl::list<int64_t> seqLens("seq-len", cl::CommaSeparated,
                                 cl::desc("sequence lengths"),
                                 cl::cat(category));
static cl::opt<bool> table("table",
                           cl::desc("print the table of standard patterns"),
                           cl::cat(category));

static void row(llvm::StringRef name, const Backbone &b,
                llvm::ArrayRef<int64_t> lengths) {
  llvm::outs() << "| " << name << " |";
  for (int64_t T : lengths) {
    ReachReport r = analyzeReach(T, slcBlock, window, b);
    if (r.tooCostly) {
      llvm::outs() << " too costly | | |";
      continue;
    }
    llvm::outs() << llvm::formatv(" {0} | {1} | {2} |",
                                  r.hops < 0 ? std::string("unreachable")
                                             : std::to_string(r.hops),
                                  r.forcedBlocks, r.backboneKeys);
  }
  llvm::outs() << "\n";
}

/// The options, checked as the dialect checks them (backbone_c1..c3 by
/// BackboneAttr's verifier, config_c1 and the block sizes as ConfigAttr's).
static bool validOptions() {
  auto fail = [](const llvm::Twine &message) {
    llvm::errs() << "nsa-reach: " << message << "\n";
    return false;
  };
  if (slcBlock <= 0)
    return fail("slc-block must be positive, found " + llvm::Twine(slcBlock));
  if (window <= 0)
    return fail("window must be positive, found " + llvm::Twine(window));
  for (int64_t T : seqLens) {
    if (T <= 0)
      return fail("sequence lengths must be positive, found " +
                  llvm::Twine(T));
    if (numSelectionBlocks(T, slcBlock) > kMaxReachBlocks)
      return fail("the hop bound is computed for at most " +
                  llvm::Twine(kMaxReachBlocks) + " selection blocks, found " +
                  llvm::Twine(numSelectionBlocks(T, slcBlock)) + " at T = " +
                  llvm::Twine(T));
  }
  mlir::MLIRContext context;
  context.loadDialect<mlir::nsa::NSADialect>();
  mlir::ScopedDiagnosticHandler handler(&context, [](mlir::Diagnostic &d) {
    llvm::errs() << "nsa-reach: " << d.str() << "\n";
    return mlir::success();
  });
  std::vector<int64_t> list(blocks.begin(), blocks.end());
  return static_cast<bool>(mlir::nsa::BackboneAttr::getChecked(
      [&] { return mlir::emitError(mlir::UnknownLoc::get(&context)); },
      &context, int64_t(initial), int64_t(local), int64_t(logLevels),
      int64_t(hubStride),
      list.empty() ? mlir::DenseI64ArrayAttr()
                   : mlir::DenseI64ArrayAttr::get(&context, list)));
}

int main(int argc, char **argv) {
  // --help lists nsa-reach's options, not those of the LLVM libraries
  // linked in.
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(argc, argv, "NSA backbone hop bounds\n");
  if (!validOptions())
    return 1;
  std::vector<int64_t> lengths(seqLens.begin(), seqLens.end());
  if (lengths.empty())
    lengths = {65536, 1048576};
  llvm::outs() << llvm::formatv("l' = {0}, w = {1}\n\n| backbone |", slcBlock,
                                window);
  for (int64_t T : lengths)
    llvm::outs() << " hops at T=" << T << " | forced blocks | keys |";
  llvm::outs() << "\n|---|";
  for (size_t i = 0; i < lengths.size(); ++i)
    llvm::outs() << "---|---|---|";
  llvm::outs() << "\n";
  if (!table) {
    Backbone b{initial, local, logLevels, hubStride,
               std::vector<int64_t>(blocks.begin(), blocks.end())};
    row("given", b, lengths);
    return 0;
  }
  row("paper: initial 1, local 2", Backbone{1, 2}, lengths);
  row("local 2 only", Backbone{0, 2}, lengths);
  row("initial 1, local 2, log 8", Backbone{1, 2, 8}, lengths);
  row("initial 1, local 2, log 15", Backbone{1, 2, 15}, lengths);
  row("local 1, log 15", Backbone{0, 1, 15}, lengths);
  row("initial 1, local 2, hubs every 16", Backbone{1, 2, 0, 16}, lengths);
  row("initial 1, local 2, hubs every 256", Backbone{1, 2, 0, 256}, lengths);
  row("initial 1, local 2, log 6, hubs every 64", Backbone{1, 2, 6, 64},
      lengths);
  row("initial 1, local 2, blocks [1024, 8192]",
      Backbone{1, 2, 0, 0, {1024, 8192}}, lengths);
  return 0;
}
