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
Collective::~Collective() = default;
Collective::Pending::~Pending() = default;

HfModel::~HfModel() = default;
HfTokenizer::~HfTokenizer() = default;

}  // namespace loom
