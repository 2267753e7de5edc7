//===- Descriptor.h - memref descriptors of contiguous tensors --*- C++ -*-===//
//
// The entry points that nsa-to-ptx compiles (`_mlir_ciface_*`) take each
// tensor as a pointer to its memref descriptor: allocated and aligned
// pointers, offset, sizes, strides. Header-only, for the runtime and the
// programs that call compiled layers.
//
//===----------------------------------------------------------------------===//

#ifndef NSA_RUNTIME_DESCRIPTOR_H
#define NSA_RUNTIME_DESCRIPTOR_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace nsa::runtime {

/// The descriptor words of the contiguous (row-major) tensor of `shape` at
/// `ptr`: {ptr, ptr, 0, sizes..., strides...}.
inline std::vector<int64_t>
contiguousDescriptor(const void *ptr, const std::vector<int64_t> &shape) {
  std::size_t rank = shape.size();
  std::vector<int64_t> words(3 + 2 * rank, 0);
  words[0] = words[1] = reinterpret_cast<int64_t>(ptr);
  int64_t stride = 1;
  for (std::size_t i = rank; i-- > 0;) {
    words[3 + i] = shape[i];
    words[3 + rank + i] = stride;
    stride *= shape[i];
  }
  return words;
}

} // namespace nsa::runtime

#endif // NSA_RUNTIME_DESCRIPTOR_H
