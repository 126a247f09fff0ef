#include "train/ema.hpp"

#include <map>

#include "loom/error.hpp"

namespace loom::training {

ParameterEma::ParameterEma(double decay, const std::vector<ModelParameter>& parameters, Backend& backend)
    : decay_(static_cast<float>(decay)), parameters_(parameters), backend_(backend) {
  for (const auto& p : parameters_) averages_.push_back(p.parameter->data().clone());
}

void ParameterEma::update() {
  const float keep = decay_, take = 1.0f - decay_;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    // Addresses in the backend's memory (the averages are clones of the parameters, on their
    // device): the backend scales and adds, the host reads nothing.
    float* e = averages_[i].device_data<float>();
    const float* p = parameters_[i].parameter->data().device_data<float>();
    const std::int64_t n = averages_[i].numel();
    backend_.scale(e, keep, e, n, false);
    backend_.scale(p, take, e, n, true);
  }
}

void ParameterEma::swap() {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor held = parameters_[i].parameter->data().clone();
    parameters_[i].parameter->data().copy_from(averages_[i]);
    averages_[i].copy_from(held);
  }
}

std::vector<std::pair<std::string, Tensor>> ParameterEma::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    out.emplace_back("ema/" + parameters_[i].parameter->name(), averages_[i]);
  return out;
}

void ParameterEma::load_state(const std::vector<std::pair<std::string, Tensor>>& state) {
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < parameters_.size(); ++i) index["ema/" + parameters_[i].parameter->name()] = i;
  std::vector<const Tensor*> sources(parameters_.size(), nullptr);
  for (const auto& [name, tensor] : state) {
    const auto it = index.find(name);
    if (it == index.end())
      throw UserError("the saved weight average has '" + name + "', which belongs to no parameter of this model");
    const Tensor& mine = averages_[it->second];
    if (!tensor.defined() || tensor.dtype() != DType::f32 || !(tensor.shape() == mine.shape()))
      throw UserError("the saved weight average '" + name + "' is " + tensor.str() + ", expected " + mine.str());
    sources[it->second] = &tensor;
  }
  for (std::size_t i = 0; i < sources.size(); ++i)
    if (!sources[i]) throw UserError("the saved weight average lacks 'ema/" + parameters_[i].parameter->name() + "'");
  for (std::size_t i = 0; i < sources.size(); ++i) averages_[i].copy_from(*sources[i]);
}

}  // namespace loom::training
