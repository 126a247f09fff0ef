// Out-of-line destructors: they anchor every interface's vtable and type information in
// libloom_core.so, so plugins built with hidden visibility share one definition of each.
#include "loom/hf_interop.hpp"
#include "loom/kinds/attention.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/kinds/lr_schedule.hpp"
#include "loom/kinds/model.hpp"
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
