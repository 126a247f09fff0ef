// The tape: recording, the backward driver and the gradient plumbing nodes use.
#include "numerics/tape.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

#include "loom/error.hpp"
#include "numerics/strided.hpp"

namespace loom {
namespace detail {

namespace {

// Every tape (and every clear of one) gets a fresh epoch, so a tensor recorded before a clear
// can be told apart from a live one.
std::uint32_t next_epoch() {
  static std::atomic<std::uint32_t> counter{0};
  std::uint32_t e = counter.fetch_add(1, std::memory_order_relaxed) + 1;
  if (e == 0) e = counter.fetch_add(1, std::memory_order_relaxed) + 1;  // 2^32 clears later
  return e;
}

constexpr std::uint64_t index_mask = 0xffffffffull;

// A new tensor of `shape` filled with `value`, in `type`'s memory.
Tensor filled(BufferType& type, const Shape& shape, float value) {
  if (&type == &host_buffer_type()) return Tensor::full(shape, value);
  Tensor t = Tensor::empty(shape, DType::f32, type);
  t.copy_from(Tensor::full(shape, value));
  return t;
}

// dst (+)= alpha * src for two tensors of one shape, any strides, in `backend`'s memory.
void add_strided(Backend& backend, const Tensor& src, const Tensor& dst, float alpha, bool accumulate) {
  if (src.is_contiguous() && dst.is_contiguous()) {
    backend.scale(src.device_data<float>(), alpha, dst.device_data<float>(), src.numel(), accumulate);
    return;
  }
  if (!dst.is_host_visible() || !src.is_host_visible()) {
    // Device memory: the host cannot walk the strides, so the sum is made contiguous on the
    // device and copied into place (the copies stage strided ranges, see Tensor::copy_from).
    const Tensor s = src.clone();
    const Tensor d = accumulate ? dst.clone() : Tensor::empty(dst.shape(), DType::f32, dst.buffer_type());
    backend.scale(s.device_data<float>(), alpha, d.device_data<float>(), s.numel(), accumulate);
    dst.copy_from(d);
    return;
  }
  const float* s = src.data<float>();
  float* d = dst.data<float>();
  const std::int64_t ss = src.rank() ? src.stride(-1) : 1;
  const std::int64_t ds = dst.rank() ? dst.stride(-1) : 1;
  for_each_row_pair(src.shape(), src.strides(), dst.strides(),
                    [&](std::int64_t so, std::int64_t dof, std::int64_t len) {
                      if (ss == 1 && ds == 1) {
                        backend.scale(s + so, alpha, d + dof, len, accumulate);
                      } else {
                        for (std::int64_t i = 0; i < len; ++i) {
                          const float v = alpha * s[so + i * ss];
                          float& out = d[dof + i * ds];
                          out = accumulate ? out + v : v;
                        }
                      }
                    });
}

}  // namespace

// ---- Arena

void* Arena::allocate(std::size_t bytes, std::size_t alignment) {
  while (current_ < chunks_.size()) {
    Chunk& c = chunks_[current_];
    const auto base = reinterpret_cast<std::uintptr_t>(c.data.get());
    const std::size_t start = ((base + used_ + alignment - 1) & ~(alignment - 1)) - base;
    if (start + bytes <= c.size) {
      used_ = start + bytes;
      return c.data.get() + start;
    }
    ++current_;
    used_ = 0;
  }
  const std::size_t size = std::max(chunk_bytes, bytes + alignment);
  chunks_.push_back({std::unique_ptr<std::byte[]>(new std::byte[size]), size});
  current_ = chunks_.size() - 1;
  used_ = 0;
  return allocate(bytes, alignment);
}

void Arena::reset() {
  current_ = 0;
  used_ = 0;
}

// ---- TapeState

TapeState::TapeState() : epoch_(next_epoch()) {
  vars_.emplace_back();
}

TapeState::~TapeState() {
  clear();
}

bool TapeState::requires_grad(const Tensor& t, const char* op) const {
  if (Parameter* p = TensorAccess::param(t)) return p->requires_grad();
  const std::uint64_t v = TensorAccess::var(t);
  if (v == 0) return false;
  if ((v >> 32) != epoch_ || (v & index_mask) >= vars_.size())
    throw InternalError(std::string(op) +
                        ": an input was recorded on another tape, or on this one before it was cleared; "
                        "detach() it or recompute it in this step");
  return true;
}

GradTarget TapeState::target(const Tensor& t) const {
  GradTarget g;
  std::int64_t base_offset = 0, base_numel = 0;
  if (Parameter* p = TensorAccess::param(t)) {
    if (!p->requires_grad()) return g;
    g.param = p;
    base_offset = TensorAccess::param_value(*p).offset();
    base_numel = TensorAccess::param_value(*p).numel();
  } else if (const std::uint64_t v = TensorAccess::var(t); v != 0 && (v >> 32) == epoch_) {
    g.var = static_cast<std::uint32_t>(v & index_mask);
    base_offset = vars_[g.var].base_offset;
    base_numel = vars_[g.var].shape.numel();
  } else {
    return g;
  }
  g.offset = t.offset() - base_offset;
  g.shape = t.shape();
  g.strides = t.strides();
  g.covers_base = g.offset == 0 && t.numel() == base_numel && t.is_contiguous();
  return g;
}

void TapeState::add_output(Node& node, Tensor& out) {
  const auto index = static_cast<std::uint32_t>(vars_.size());
  Variable& v = vars_.emplace_back();
  v.shape = out.shape();
  v.base_offset = out.offset();
  v.type = &out.buffer_type();
  v.backend = node.backend;
  TensorAccess::set_param(out, nullptr);
  TensorAccess::set_var(out, (std::uint64_t{epoch_} << 32) | index);
  ++node.num_outputs;
}

void TapeState::backward(std::span<const Tensor> roots, std::span<Tensor> seeds, float scalar_seed, bool adopt_seeds) {
  if (!seeds.empty() && seeds.size() != roots.size())
    throw InternalError("backward: " + std::to_string(roots.size()) + " roots but " + std::to_string(seeds.size()) +
                        " seeds");
  try {
    for (std::size_t r = 0; r < roots.size(); ++r) {
      const Tensor& root = roots[r];
      if (!root.defined()) throw InternalError("backward: undefined root tensor");
      if (TensorAccess::var(root) == 0)
        throw InternalError("backward: " + root.str() +
                            " was not recorded (no input required a gradient, or recording was off)");
      requires_grad(root, "backward");
      Tensor* seed = seeds.empty() ? nullptr : &seeds[r];
      if (seed && (!seed->defined() || !(seed->shape() == root.shape()) || seed->dtype() != DType::f32))
        throw InternalError("backward: seed " + seed->str() + " does not match root " + root.str());
      if (!seed && root.numel() != 1)
        throw InternalError("backward: root " + root.str() + " is not a scalar; pass a seed gradient");
      const GradTarget rt = target(root);
      Variable& rv = vars_[rt.var];
      if (seed && &seed->buffer_type() != rv.type)
        throw InternalError("backward: seed " + seed->str() + " is on " + seed->device().str() + " but root " +
                            root.str() + " is on " + root.device().str());
      if (!rv.grad.defined() && rt.covers_base) {
        // The first seed of a whole variable becomes its gradient: adopted when the caller gave
        // it up, else copied (the backward pass writes into gradient buffers).
        if (!seed)
          rv.grad = filled(*rv.type, rv.shape, scalar_seed);
        else if (adopt_seeds && seed->is_contiguous() && seed->storage_use_count() == 1)
          rv.grad = std::exchange(*seed, Tensor()).detach().view(rv.shape);
        else
          rv.grad = seed->clone().view(rv.shape);
        continue;
      }
      const Tensor g = seed ? *seed : filled(*rv.type, root.shape(), scalar_seed);
      if (!rv.grad.defined()) rv.grad = filled(*rv.type, rv.shape, 0.0f);
      const Tensor view = TensorAccess::view_of(rv.grad, rv.grad.offset() + rt.offset, rt.shape, rt.strides);
      if (!view.is_host_visible()) {
        add_strided(*rv.backend, g, view, 1.0f, true);
        continue;
      }
      float* dst = view.data<float>();
      const std::int64_t ds = rt.shape.rank() ? rt.strides[static_cast<std::size_t>(rt.shape.rank() - 1)] : 1;
      const std::int64_t ss = g.rank() ? g.stride(-1) : 1;
      const float* src = g.data<float>();
      for_each_row_pair(rt.shape, g.strides(), rt.strides, [&](std::int64_t so, std::int64_t dof, std::int64_t len) {
        for (std::int64_t i = 0; i < len; ++i) dst[dof + i * ds] += src[so + i * ss];
      });
    }
  } catch (...) {
    clear();
    throw;
  }
  try {
    std::size_t ready = first_uses_.size();  // first_uses_[ready..] have been announced
    std::size_t needed = uses_.size();       // uses_[needed..] have been announced
    for (std::size_t i = nodes_.size(); i-- > 0;) {
      Node* node = nodes_[i];
      // Parameters whose last use is node i (or a later node, which took no gradient).
      for (; needed > 0 && uses_[needed - 1].node >= i; --needed)
        if (on_parameter_needed) on_parameter_needed(*uses_[needed - 1].parameter, uses_[needed - 1].values);
      bool reached = false;
      for (std::uint32_t o = 0; o < node->num_outputs; ++o) reached |= vars_[node->first_output + o].grad.defined();
      if (reached) {
        BackwardPass pass(*this, *node->backend);
        node->backward(pass);
      }
      for (std::uint32_t o = 0; o < node->num_outputs; ++o) vars_[node->first_output + o].grad.reset();
      nodes_[i] = nullptr;
      node->~Node();
      // Parameters first used at or after node i: no node left can add to their gradients.
      for (; ready > 0 && first_uses_[ready - 1].first >= i; --ready)
        if (on_gradient_ready) on_gradient_ready(*first_uses_[ready - 1].second);
    }
    for (; ready > 0; --ready)
      if (on_gradient_ready) on_gradient_ready(*first_uses_[ready - 1].second);
  } catch (...) {
    clear();
    throw;
  }
  clear();
}

void TapeState::note_inputs(std::span<const Tensor* const> inputs) {
  for (const Tensor* t : inputs) {
    if (!t || !t->defined()) continue;
    Parameter* p = TensorAccess::param(*t);
    if (p && on_parameter_needed) uses_.push_back({static_cast<std::uint32_t>(nodes_.size()), p, true});
    // Frozen parameters have no gradient; they are announced when their last user is past only
    // to the tape's owner that tracks uses (on_parameter_needed): FSDP frees their unit then.
    if (!p || (!p->requires_grad() && !on_parameter_needed) || TensorAccess::param_noted_epoch(*p) == epoch_) continue;
    TensorAccess::param_noted_epoch(*p) = epoch_;
    first_uses_.emplace_back(static_cast<std::uint32_t>(nodes_.size()), p);
  }
}

void TapeState::values_not_needed(const Tensor& t) {
  Parameter* p = t.defined() ? TensorAccess::param(t) : nullptr;
  if (!p || nodes_.empty()) return;
  const auto node = static_cast<std::uint32_t>(nodes_.size() - 1);
  for (auto it = uses_.rbegin(); it != uses_.rend() && it->node >= node; ++it)
    if (it->parameter == p && it->node == node) it->values = false;
}

void TapeState::clear() {
  first_uses_.clear();
  uses_.clear();
  on_parameter_needed = nullptr;
  on_gradient_ready = nullptr;  // for one backward pass; a recycled state starts without
  for (std::size_t i = nodes_.size(); i-- > 0;)
    if (nodes_[i]) nodes_[i]->~Node();
  nodes_.clear();
  vars_.clear();
  vars_.emplace_back();
  arena_.reset();
  epoch_ = next_epoch();
}

TapeState* recording_state(Tape* tape, std::initializer_list<const Tensor*> inputs, const char* op) {
  return recording_state(tape, std::span<const Tensor* const>(inputs.begin(), inputs.size()), op);
}

TapeState* recording_state(Tape* tape, std::span<const Tensor* const> inputs, const char* op) {
  if (!tape) return nullptr;
  TapeState& state = tape->state();
  if (!state.enabled) {
    if (state.parameter_collector)
      for (const Tensor* t : inputs)
        if (t && t->defined())
          if (Parameter* p = TensorAccess::param(*t)) state.parameter_collector->push_back(p);
    return nullptr;
  }
  bool any = false;
  for (const Tensor* t : inputs)
    if (t && t->defined()) any |= state.requires_grad(*t, op);
  if (!any) return nullptr;
  state.note_inputs(inputs);
  return &state;
}

// ---- BackwardPass

const Tensor& BackwardPass::output_grad(const Node& node, int i) const {
  return state_.variables()[node.first_output + static_cast<std::uint32_t>(i)].grad;
}

Tensor BackwardPass::take_output_grad(const Node& node, int i) {
  return std::move(state_.variables()[node.first_output + static_cast<std::uint32_t>(i)].grad);
}

BackwardPass::Buffer BackwardPass::grad(const GradTarget& t, bool shared) {
  Tensor* base;
  bool fresh;
  if (t.param) {
    Tensor& g = TensorAccess::param_grad(*t.param);
    bool& has = TensorAccess::param_has_grad(*t.param);
    if (!g.defined())
      g = Tensor::empty(t.param->shape(), DType::f32, TensorAccess::param_value(*t.param).buffer_type());
    fresh = !has;
    has = true;
    base = &g;
  } else {
    Variable& v = state_.variables()[t.var];
    fresh = !v.grad.defined();
    if (fresh) v.grad = Tensor::empty(v.shape, DType::f32, *v.type);
    base = &v.grad;
  }
  if (fresh && (!t.covers_base || shared)) {
    backend_.fill(base->device_data<float>(), 0.0f, base->numel());
    fresh = false;
  }
  return {TensorAccess::view_of(*base, base->offset() + t.offset, t.shape, t.strides), !fresh};
}

void BackwardPass::accumulate(const GradTarget& target, const Tensor& g, float alpha) {
  if (!target.active() || !g.defined()) return;
  Buffer b = grad(target);
  add_strided(backend_, g, b.tensor, alpha, b.accumulate);
}

void BackwardPass::give(const GradTarget& target, Tensor&& g) {
  if (!target.active() || !g.defined()) return;
  if (target.var && target.covers_base && g.is_contiguous() && g.dtype() == DType::f32) {
    Variable& v = state_.variables()[target.var];
    if (!v.grad.defined() && g.numel() == v.shape.numel()) {
      v.grad = g.detach().view(v.shape);
      g.reset();
      return;
    }
  }
  accumulate(target, g);
  g.reset();
}

}  // namespace detail

// ---- Tape

namespace {

// Tapes are often made per step (`Tape tape;` in the training loop). Their states are recycled
// so that a new tape reuses the arena chunks and vectors of an old one and allocates nothing.
struct TapePool {
  std::mutex mutex;
  std::vector<std::unique_ptr<detail::TapeState>> states;
};
TapePool& tape_pool() {
  static auto* pool = new TapePool;  // never destroyed: tapes may outlive static destruction
  return *pool;
}
constexpr std::size_t max_pooled_tapes = 8;

}  // namespace

Tape::Tape() {
  TapePool& pool = tape_pool();
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (!pool.states.empty()) {
      state_ = std::move(pool.states.back());
      pool.states.pop_back();
    }
  }
  if (!state_) {
    state_ = std::make_unique<detail::TapeState>();
    std::lock_guard<std::mutex> lock(tape_pool().mutex);
    pool.states.reserve(max_pooled_tapes);
  }
}

Tape::~Tape() {
  state_->clear();
  state_->enabled = true;
  TapePool& pool = tape_pool();
  std::lock_guard<std::mutex> lock(pool.mutex);
  if (pool.states.size() < max_pooled_tapes) pool.states.push_back(std::move(state_));
}
bool Tape::recording() const {
  return state_->enabled;
}
void Tape::set_enabled(bool enabled) {
  state_->enabled = enabled;
}
void Tape::backward(const Tensor& root, float grad) {
  state_->backward(std::span<const Tensor>(&root, 1), {}, grad, false);
}
void Tape::backward(const Tensor& root, const Tensor& seed) {
  Tensor handle = seed;  // copied into a gradient buffer, never adopted
  state_->backward(std::span<const Tensor>(&root, 1), std::span<Tensor>(&handle, 1), 0.0f, false);
}
void Tape::backward(const Tensor& root, Tensor&& seed) {
  Tensor owned = std::move(seed);
  state_->backward(std::span<const Tensor>(&root, 1), std::span<Tensor>(&owned, 1), 0.0f, true);
}
void Tape::backward(std::span<const Tensor> roots, std::span<const Tensor> seeds) {
  if (seeds.size() != roots.size())
    throw InternalError("backward: " + std::to_string(roots.size()) + " roots but " + std::to_string(seeds.size()) +
                        " seeds");
  // Not adopted, so the seeds are only read.
  state_->backward(roots, std::span<Tensor>(const_cast<Tensor*>(seeds.data()), seeds.size()), 0.0f, false);
}
void Tape::clear() {
  state_->clear();
}
void Tape::on_gradient_ready(std::function<void(Parameter&)> callback) {
  state_->on_gradient_ready = std::move(callback);
}
void Tape::on_parameter_needed(std::function<void(Parameter&, bool)> callback) {
  state_->on_parameter_needed = std::move(callback);
}
std::size_t Tape::size() const {
  return state_->size();
}

}  // namespace loom
