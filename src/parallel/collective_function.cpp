#include "parallel/collective_function.h"

#include <cstdint>

namespace hybridflow::collective_autograd {

void save_comm(AutogradContext* ctx, Communicator* comm) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(comm));
}

Communicator& saved_comm(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

}  // namespace hybridflow::collective_autograd
