/*===- embed.c - nsa through its C API in a project of its own -----------===*
 *
 * The same as embed.cpp with the C API alone: a context with the pipeline
 * dialects, the nsa dialect loaded through its handle, the module parsed,
 * nsa-to-ptx built from an option string (a bad one is refused first) and
 * run.
 *
 *===----------------------------------------------------------------------===*/

#include "NSA-c/Dialects.h"
#include "NSA-c/Passes.h"

#include "mlir-c/IR.h"
#include "mlir-c/Pass.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void printError(MlirStringRef message, void *userData) {
  fprintf(stderr, "%s: %.*s\n", (const char *)userData, (int)message.length,
          message.data);
}

static void appendText(MlirStringRef text, void *userData) {
  size_t *length = (size_t *)userData;
  *length += text.length;
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
  nsaRegisterPasses();

  MlirModule module =
      mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(source));
  free(source);
  if (mlirModuleIsNull(module))
    return 1;

  MlirPassManager pm = mlirPassManagerCreate(ctx);
  MlirOpPassManager opm = mlirPassManagerGetAsOpPassManager(pm);
  /* A bad option is refused before anything is added. */
  if (mlirLogicalResultIsSuccess(nsaBuildToPTXPipeline(
          opm, mlirStringRefCreateFromCString("chip=sm_12"), printError,
          "embed-c (expected)"))) {
    fprintf(stderr, "embed-c: chip=sm_12 was accepted\n");
    return 1;
  }
  if (mlirLogicalResultIsFailure(nsaBuildToPTXPipeline(
          opm, mlirStringRefCreateFromCString("format=isa"), printError,
          "embed-c")))
    return 1;
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
