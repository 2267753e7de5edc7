//===- ReferenceCApiTest.cpp - the float64 reference's C entry points -----===//
//
// nsaReferenceForward / nsaReferenceBackward (libnsa_reference) on the
// arguments a caller may get wrong: no tokens, null gradients, a reserved
// field set. Each is refused with a message naming the problem, or (no
// tokens) succeeds writing nothing.
//
//===----------------------------------------------------------------------===//

#include "NSA-c/Reference.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

nsaLayerDesc smallDesc() {
  nsaLayerDesc d = nsaPaperLayerDesc(2, 1, 8, 4);
  d.dtype = nsaF32;
  d.config.cmpBlock = 8;
  d.config.cmpStride = 4;
  d.config.slcBlock = 16;
  d.config.numSelected = 4;
  d.config.window = 16;
  return d;
}

std::string lastError() { return nsaGetLastError(); }

TEST(ReferenceCApi, NoTokensWritesNothing) {
  nsaLayerDesc d = smallDesc();
  // Null tensors are fine with no rows (empty tensors have no storage).
  EXPECT_EQ(nsaReferenceForward(&d, 1, 0, nullptr, nullptr, nullptr, nullptr,
                                nullptr, nullptr, 0, nullptr, nullptr),
            0)
      << lastError();
  double q = 1, out = 7;
  EXPECT_EQ(nsaReferenceForward(&d, 2, 0, &q, &q, &q, &q, nullptr, nullptr, 0,
                                &out, nullptr),
            0)
      << lastError();
  EXPECT_EQ(out, 7);
  d.config.linearPool = 1;
  std::vector<double> w(2 * 8, 0.125), dw(2 * 8, -1);
  EXPECT_EQ(nsaReferenceBackward(&d, 1, 0, nullptr, nullptr, nullptr, nullptr,
                                 w.data(), nullptr, 0, nullptr, nullptr,
                                 nullptr, nullptr, nullptr, nullptr,
                                 dw.data()),
            0)
      << lastError();
  for (double x : dw)
    EXPECT_EQ(x, 0.0);
}

TEST(ReferenceCApi, NullGradientsAreNamed) {
  nsaLayerDesc d = smallDesc();
  int64_t T = 5;
  std::vector<double> q(T * 2 * 8, 0.1), k(T * 8, 0.2), v(T * 4, 0.3),
      g(T * 2 * 3, 0.5), dout(T * 2 * 4, 1), dq(q.size()), dk(k.size()),
      dv(v.size()), dg(g.size());
  EXPECT_NE(nsaReferenceBackward(&d, 1, T, q.data(), k.data(), v.data(),
                                 g.data(), nullptr, nullptr, 0, nullptr,
                                 dout.data(), nullptr, dk.data(), dv.data(),
                                 dg.data(), nullptr),
            0);
  EXPECT_NE(lastError().find("dq is null"), std::string::npos) << lastError();
  EXPECT_NE(nsaReferenceBackward(&d, 1, T, q.data(), k.data(), v.data(),
                                 g.data(), nullptr, nullptr, 0, nullptr,
                                 dout.data(), dq.data(), dk.data(), dv.data(),
                                 nullptr, nullptr),
            0);
  EXPECT_NE(lastError().find("dgates is null"), std::string::npos)
      << lastError();
  EXPECT_EQ(nsaReferenceBackward(&d, 1, T, q.data(), k.data(), v.data(),
                                 g.data(), nullptr, nullptr, 0, nullptr,
                                 dout.data(), dq.data(), dk.data(), dv.data(),
                                 dg.data(), nullptr),
            0)
      << lastError();
}

TEST(ReferenceCApi, ReservedMustBeZero) {
  nsaLayerDesc d = smallDesc();
  d.config.reserved = 3;
  double x = 0;
  EXPECT_NE(nsaReferenceForward(&d, 1, 1, &x, &x, &x, &x, nullptr, nullptr, 0,
                                &x, nullptr),
            0);
  EXPECT_NE(lastError().find("reserved must be 0, found 3"), std::string::npos)
      << lastError();
}

} // namespace
