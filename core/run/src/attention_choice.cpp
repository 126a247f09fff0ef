// model.attention against the run's backend (loom/run/run_config.hpp, docs/attention-kernels.md#auto).
#include <string>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/kinds/attention.hpp"
#include "loom/run/run_config.hpp"

namespace loom {

namespace {

std::string where(const Value& node) {
  return node.location().known() ? node.location().str() + ": " : "";
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

void resolve_attention_kernel(const Registry& registry, Value& config, const Backend& backend) {
  Value* model = config.find("model");
  Value* node = model && model->is_map() ? model->find("attention") : nullptr;
  if (node == nullptr || node->is_null()) return;
  const Value* type = node->is_map() ? node->find("type") : node;
  if (type == nullptr || !type->is_string()) return;  // validation has said what is wrong already
  const Device device = backend.device();
  const Value* backend_type = config.at_path("backend.type");
  const std::string backend_name =
      "backend '" +
      (backend_type && backend_type->is_string() ? backend_type->as_string() : std::string(backend.name())) + "'";
  const std::vector<std::string> fitting = registry.attention_kernels_on(device);
  const std::string name = type->as_string();
  if (name == Registry::auto_attention) {
    if (fitting.empty())
      throw UserError(where(*node) + "model.attention: auto: no loaded attention kernel computes on " + device.str() +
                      ", where " + backend_name +
                      " keeps its tensors (attention kernels: " + registry.describe_attention_devices() +
                      "); load a plugin with a kernel for that device, or choose another backend");
    // As a resolved config holds any kernel: a map with its type and every default filled in.
    Value chosen(fitting.front());
    chosen.set_location(node->location());
    *node = config::validate_component(AttentionKernel::kind, chosen, "model.attention", registry);
    return;
  }
  const Handle<AttentionKernel> kernel =
      registry.create<AttentionKernel>(ComponentRef{std::string(AttentionKernel::kind), "", *node, "model.attention"});
  if (kernel->device() == device) return;
  throw UserError(where(*node) + "model.attention: the attention kernel '" + name + "' computes on " +
                  kernel->device().str() + ", but " + backend_name + " keeps its tensors on " + device.str() +
                  (fitting.empty() ? "; no loaded attention kernel computes there (attention kernels: " +
                                         registry.describe_attention_devices() + ")"
                                   : "; attention kernels that compute there: " + join(fitting) +
                                         " (or `model.attention: auto`, which picks " + fitting.front() + ")"));
}

}  // namespace loom
