// Input validation shared by the algo functions: every message says which argument and what was expected.
#pragma once

#include <torch/torch.h>

#include <string>

#include "hybridflow/core/error.h"

namespace hybridflow::algo::detail {

inline void check_response_tensor(const at::Tensor& t, const char* what, const char* where) {
  HF_CHECK(t.defined(), where, ": ", what, " is required but was not set");
  HF_CHECK(t.dim() == 2, where, ": ", what, " must be [B, R], got shape ", t.sizes());
}

inline void check_same_shape(const at::Tensor& t, const at::Tensor& like, const char* what, const char* where) {
  HF_CHECK(t.sizes() == like.sizes(), where, ": ", what, " shape ", t.sizes(), " must equal ", like.sizes());
}

inline void check_per_sequence(const at::Tensor& t, int64_t batch, const char* what, const char* where) {
  HF_CHECK(t.defined(), where, ": ", what, " is required but was not set");
  HF_CHECK(t.dim() == 1 && t.size(0) == batch, where, ": ", what, " must be [B] with B=", batch, ", got shape ",
           t.sizes());
}

// Float math at least in fp32: bf16/fp16 rewards would lose the small differences advantages are made of.
inline at::Tensor as_float(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? t : t.to(at::kFloat);
}

}  // namespace hybridflow::algo::detail
