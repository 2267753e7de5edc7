/*===- NSA-c/Error.h - how every nsa C entry point reports failure --*- C -*-===*
 *
 * One convention for all of nsa's C libraries (libNSA-C, libnsa_reference,
 * libnsa_runtime, the layer libraries):
 *
 *   - a call that fails says so in its result: a nonzero status (nsaStatus,
 *     or 1 where the result is an int), NULL where it returns an object, a
 *     failed MlirLogicalResult where it follows MLIR's C API;
 *   - it leaves a message, "<function>: <reason>", that nsaGetLastError()
 *     returns on the same thread until the next call that fails or
 *     clears it (calls that start work clear it first);
 *   - a call never crashes or aborts on bad arguments: they are checked
 *     before anything runs. (One print remains: an option value that does
 *     not parse, "query-tile=abc", is also reported on stderr by LLVM's
 *     command-line parser, which MLIR's pass options use.)
 *
 * The message lives in libnsa_error, which the others link, so one
 * nsaGetLastError() serves every library a program loads.
 *
 *===----------------------------------------------------------------------===*/

#ifndef NSA_C_ERROR_H
#define NSA_C_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/* The message of the calling thread's last failure ("" if none). Valid
 * until the thread's next nsa call. */
const char *nsaGetLastError(void);

/* Records `message` (NULL: clears it) as the calling thread's last error.
 * For nsa's libraries and layer libraries; applications read errors. */
void nsaSetLastError(const char *message);

#ifdef __cplusplus
}
#endif

#endif /* NSA_C_ERROR_H */
