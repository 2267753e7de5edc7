/*===- embed.c - nsa through its C API in a project of its own -----------===*
 *
 * The same as embed.cpp with the C API alone: a context with the pipeline
 * dialects, the nsa dialect loaded through its handle, #nsa.config built,
 * refused and read; the module parsed, a textual pipeline of nsa passes and
 * upstream's canonicalize run (the generated pass C API), then nsa-to-ptx
 * built from an option string (a bad one is refused first) and run. Every
 * failure is read from nsaGetLastError() (NSA-c/Error.h).
 *
 *===----------------------------------------------------------------------===*/

#include "NSA-c/Dialects.h"
#include "NSA-c/Error.h"
#include "NSA-c/Passes.h"

#include "mlir-c/IR.h"
#include "mlir-c/Pass.h"
#include "mlir-c/Transforms.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void appendText(MlirStringRef text, void *userData) {
  size_t *length = (size_t *)userData;
  *length += text.length;
}

static void printText(MlirStringRef text, void *userData) {
  fprintf(stderr, "%s%.*s", (const char *)userData, (int)text.length,
          text.data);
}

static int fail(const char *what) {
  fprintf(stderr, "embed-c: %s: %s\n", what, nsaGetLastError());
  return 1;
}

/* #nsa.config through the C API: the paper's built and read back, a bad one
 * refused with the Spec's reason, a textual one read. */
static int checkConfig(MlirContext ctx) {
  nsaLayerDesc desc = nsaPaperLayerDesc(64, 4, 192, 128);
  MlirAttribute paper = nsaConfigAttrGet(ctx, &desc.config, 0);
  if (mlirAttributeIsNull(paper))
    return fail("nsaConfigAttrGet");
  nsaLayerConfig bad = desc.config;
  bad.cmpStride = 48; /* must divide l' = 64 */
  if (!mlirAttributeIsNull(nsaConfigAttrGet(ctx, &bad, 0))) {
    fprintf(stderr, "embed-c: cmp_stride 48 was accepted\n");
    return 1;
  }
  printf("embed-c: refused as expected: %s\n", nsaGetLastError());
  MlirAttribute text = mlirAttributeParseGet(
      ctx, mlirStringRefCreateFromCString(
               "#nsa.config<cmp_block = 32, cmp_stride = 16, slc_block = 64, "
               "num_selected = 16, window = 512>"));
  nsaLayerConfig read;
  if (mlirLogicalResultIsFailure(nsaConfigAttrGetFields(text, &read)))
    return fail("nsaConfigAttrGetFields");
  if (!mlirAttributeEqual(text, paper) || read.initialBlocks != 1 ||
      read.localBlocks != 2 || read.numSelected != 16) {
    fprintf(stderr, "embed-c: the textual config differs from C's\n");
    return 1;
  }
  return 0;
}

/* nsa-decompose and canonicalize by name, as a user's pipeline string
 * names them, and one pass created through the generated C API. */
static int runTextualPipeline(MlirContext ctx, MlirModule module) {
  MlirPassManager pm = mlirPassManagerCreate(ctx);
  MlirOpPassManager opm = mlirPassManagerGetAsOpPassManager(pm);
  MlirLogicalResult parsed = mlirParsePassPipeline(
      opm,
      mlirStringRefCreateFromCString("builtin.module(nsa-decompose, "
                                     "canonicalize)"),
      printText, "embed-c: ");
  mlirOpPassManagerAddOwnedPass(opm, mlirCreateNSAVerifyDialects());
  int bad = mlirLogicalResultIsFailure(parsed) ||
            mlirLogicalResultIsFailure(mlirPassManagerRunOnOp(
                pm, mlirModuleGetOperation(module)));
  mlirPassManagerDestroy(pm);
  if (bad)
    fprintf(stderr, "embed-c: nsa-decompose, canonicalize failed\n");
  return bad;
}


static char *readFile(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc(size + 1);
  if (fread(text, 1, size, f) != (size_t)size) {
    free(text);
    fclose(f);
    return NULL;
  }
  text[size] = 0;
  fclose(f);
  return text;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: embed-c <layer.mlir>\n");
    return 2;
  }
  char *source = readFile(argv[1]);
  if (!source) {
    fprintf(stderr, "embed-c: cannot read %s\n", argv[1]);
    return 1;
  }
  MlirDialectRegistry registry = mlirDialectRegistryCreate();
  nsaRegisterPipelineDialects(registry);
  MlirContext ctx = mlirContextCreateWithRegistry(registry, false);
  mlirDialectRegistryDestroy(registry);
  mlirDialectHandleLoadDialect(mlirGetDialectHandle__nsa__(), ctx);
  mlirRegisterNSAPasses();
  nsaRegisterPipelines();
  mlirRegisterTransformsPasses(); /* canonicalize, cse, ... by name */
  if (checkConfig(ctx))
    return 1;

  MlirModule module =
      mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(source));
  free(source);
  if (mlirModuleIsNull(module))
    return 1;
  /* A copy for the textual pipeline; the original goes to nsa-to-ptx. */
  MlirModule copy = mlirModuleFromOperation(
      mlirOperationClone(mlirModuleGetOperation(module)));
  if (runTextualPipeline(ctx, copy))
    return 1;
  mlirModuleDestroy(copy);

  MlirPassManager pm = mlirPassManagerCreate(ctx);
  MlirOpPassManager opm = mlirPassManagerGetAsOpPassManager(pm);
  /* A bad option is refused before anything is added. */
  if (mlirLogicalResultIsSuccess(nsaBuildToPTXPipeline(
          opm, mlirStringRefCreateFromCString("chip=sm_12")))) {
    fprintf(stderr, "embed-c: chip=sm_12 was accepted\n");
    return 1;
  }
  printf("embed-c: refused as expected: %s\n", nsaGetLastError());
  if (mlirLogicalResultIsFailure(nsaBuildToPTXPipeline(
          opm, mlirStringRefCreateFromCString("format=isa"))))
    return fail("nsaBuildToPTXPipeline");
  if (mlirLogicalResultIsFailure(
          mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module))))
    return 1;

  /* The result holds gpu.binary ops and host code in the LLVM dialect. */
  size_t length = 0;
  mlirOperationPrint(mlirModuleGetOperation(module), appendText, &length);
  MlirOperation first = mlirBlockGetFirstOperation(
      mlirModuleGetBody(module));
  int binaries = 0;
  for (MlirOperation op = first; !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    MlirIdentifier name = mlirOperationGetName(op);
    MlirStringRef s = mlirIdentifierStr(name);
    if (s.length == 10 && !strncmp(s.data, "gpu.binary", 10))
      ++binaries;
  }
  printf("embed-c: nsa-to-ptx through the C API: %d gpu.binary, %zu "
         "characters of IR\n",
         binaries, length);
  mlirPassManagerDestroy(pm);
  mlirModuleDestroy(module);
  mlirContextDestroy(ctx);
  return binaries > 0 ? 0 : 1;
}
