// Out-of-line destructors: they anchor every interface's vtable and type information in
// libloom_core.so, so plugins built with hidden visibility share one definition of each.
#include "loom/autograd.hpp"
#include "loom/hf_interop.hpp"
#include "loom/kinds/attention.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/kinds/lr_schedule.hpp"
#include "loom/kinds/model.hpp"
#include "loom/kinds/objective.hpp"
#include "loom/kinds/optimizer.hpp"
#include "loom/kinds/tokenizer.hpp"
#include "loom/kinds/tracker.hpp"

namespace loom {

Component::~Component() = default;
CreateContext::~CreateContext() = default;
Registrar::~Registrar() = default;

Backend::~Backend() = default;
Model::~Model() = default;
KvCache::~KvCache() = default;
Objective::~Objective() = default;

Tensor Model::token_losses(Ops& ops, const Tensor& tokens, const Tensor& targets, const Tensor& segments) {
  CrossEntropyOptions ce;
  ce.ignore_index = -1;
  ce.reduction = Reduction::none;
  return ops.cross_entropy(logits(ops, tokens, segments), targets, ce);
}
AttentionKernel::~AttentionKernel() = default;
Optimizer::~Optimizer() = default;
Dataset::~Dataset() = default;
Tokenizer::~Tokenizer() = default;
LrSchedule::~LrSchedule() = default;
Tracker::~Tracker() = default;
CollectiveGroup::~CollectiveGroup() = default;
CollectiveGroup::Pending::~Pending() = default;

namespace {
// An operation that finished when it was started.
class Done final : public CollectiveGroup::Pending {
 public:
  void wait() override {}
};
}  // namespace

std::unique_ptr<CollectiveGroup::Pending> CollectiveGroup::start_all_gather(std::span<const float> in,
                                                                            std::span<float> out) {
  all_gather(in, out);
  return std::make_unique<Done>();
}

std::unique_ptr<CollectiveGroup::Pending> CollectiveGroup::start_reduce_scatter(std::span<const float> in,
                                                                                std::span<float> out) {
  reduce_scatter(in, out);
  return std::make_unique<Done>();
}
Collective::~Collective() = default;

std::shared_ptr<CollectiveGroup> Collective::group(const Mesh& mesh, MeshAxis axis) {
  if (mesh.world_size() != size())
    throw InternalError("collective: a group of mesh " + mesh.describe() + " (" + std::to_string(mesh.world_size()) +
                        " ranks) asked of a run of " + std::to_string(size()) + " ranks");
  auto group = split(mesh.group_index(rank(), axis), mesh.coordinate(rank(), axis));
  if (!group || group->size() != mesh.size(axis) || group->rank() != mesh.coordinate(rank(), axis))
    throw InternalError("collective: the group along " + std::string(mesh_axis_name(axis)) + " of mesh " +
                        mesh.describe() + " should hold rank " + std::to_string(rank()) + " at " +
                        std::to_string(mesh.coordinate(rank(), axis)) + " of " + std::to_string(mesh.size(axis)) +
                        (group ? "; the collective's split gave " + std::to_string(group->rank()) + " of " +
                                     std::to_string(group->size())
                               : std::string("; the collective's split gave none")));
  return group;
}

HfModel::~HfModel() = default;
HfTokenizer::~HfTokenizer() = default;

}  // namespace loom
