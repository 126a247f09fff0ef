// The backend kind's helpers that live in the core: kernel group names and the host-memory check.
#include "loom/kinds/backend.hpp"

#include "loom/error.hpp"

namespace loom {

std::string_view backend_op_name(BackendOp op) {
  switch (op) {
    case BackendOp::gemm:
      return "gemm";
    case BackendOp::linear:
      return "linear";
    case BackendOp::activation:
      return "activation";
    case BackendOp::swiglu:
      return "swiglu";
    case BackendOp::add:
      return "add";
    case BackendOp::scale:
      return "scale";
    case BackendOp::fill:
      return "fill";
    case BackendOp::dropout:
      return "dropout";
    case BackendOp::layer_norm:
      return "layer_norm";
    case BackendOp::rms_norm:
      return "rms_norm";
    case BackendOp::embedding:
      return "embedding";
    case BackendOp::rope:
      return "rope";
    case BackendOp::cross_entropy:
      return "cross_entropy";
  }
  return "unknown";
}

void require_host_memory(const Backend& backend, std::string_view user) {
  const BufferType& type = backend.buffer_type();
  if (type.host_visible()) return;
  throw UserError("backend '" + std::string(backend.name()) + "' computes in " + type.device().str() +
                  " memory, which the host cannot read or write, but " + std::string(user) +
                  " keeps parameters and optimizer state in host memory (models initialise them and optimizers "
                  "update them there); choose a backend whose memory is the host's, such as cpu or reference");
}

}  // namespace loom
