//===- Pipelines.cpp - pass sequences the nsa pipelines share -------------===//
//
// The tiling and bufferization front of nsa-to-cpu and nsa-to-ptx
// (lib/Conversion), kept in one place so that both lower the same tiled IR.
//
//===----------------------------------------------------------------------===//

#include "NSA/Transforms/Passes.h"

#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void nsa::buildNSATilePipeline(OpPassManager &pm, int64_t queryTile,
                               int64_t kvTile, int64_t queryRows) {
  TileOptions tile;
  tile.queryTile = queryTile;
  tile.queryRows = queryRows;
  tile.kvTile = kvTile;
  pm.addPass(createTile(tile));
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
}

void nsa::buildNSABufferizePipeline(OpPassManager &pm) {
  bufferization::OneShotBufferizePassOptions bufferize;
  bufferize.bufferizeFunctionBoundaries = true;
  bufferize.functionBoundaryTypeConversion =
      bufferization::LayoutMapOption::IdentityLayoutMap;
  pm.addPass(bufferization::createOneShotBufferizePass(bufferize));
  // Folds the self-copies that in-place slice updates leave.
  pm.addPass(createCSEPass());
  pm.addPass(createCanonicalizerPass());
}
