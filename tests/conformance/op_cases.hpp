// The operations the conformance suite exercises: each case makes random inputs of a random
// shape (odd, non-multiple-of-8 sizes included) and runs one or more operations on them.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "numerics_test_support.hpp"

namespace loom::test {

// Draws sizes from a seed.
class Dims {
 public:
  explicit Dims(std::uint64_t seed);
  std::int64_t between(std::int64_t lo, std::int64_t hi);  // inclusive
  std::int64_t odd(std::int64_t lo, std::int64_t hi);      // an odd value in [lo, hi]
  std::uint64_t key() { return key_ + 1000 + counter_++; }

 private:
  std::uint64_t key_;
  std::uint32_t counter_ = 0;
};

// A case's inputs, made on the host; evaluate() copies them to the backend's device.
struct CaseData {
  std::vector<Tensor> params;  // f32 inputs: each becomes a Parameter
  std::vector<Tensor> consts;  // ids, targets, positions, segment ids
  std::shared_ptr<RopeTable> rope;
};

struct CaseEnv {
  Ops& ops;
  std::vector<Tensor> p;       // the parameters' tensors, in CaseData::params order
  const CaseData& data;        // consts on the backend's device (read them with to_int_vector())
  AttentionKernel* attention;  // null when no attention kernel computes on the backend's device
};

struct OpCase {
  std::string name;
  std::function<CaseData(Dims&)> make;
  std::function<std::vector<Tensor>(CaseEnv&)> run;
  double rtol = 2e-4;      // against reference, relative to the result's scale
  double fd_step = 3e-3;   // finite-difference step
  double fd_tol = 1e-2;    // finite differences vs analytic gradient, relative to the gradient's scale
  bool attention = false;  // runs an attention kernel (attention_for(backend))
};

const std::vector<OpCase>& op_cases();
const OpCase& op_case(const std::string& name);
std::vector<std::string> op_case_names();

enum class Mode {
  all,     // every input requires a gradient
  twice,   // the operations run twice on the same inputs: gradients accumulate
  frozen,  // every other input is frozen: gradients that nobody wants are not computed
};

struct Evaluation {
  std::vector<std::vector<float>> outputs;
  std::vector<std::vector<float>> grads;  // per parameter; empty when it got none
};

// Runs the case on `backend` with the given inputs, copied to its device (outputs and gradients
// are copied back); with `backward`, seeds every output with a fixed random gradient and
// back-propagates. Attention runs on attention_for(backend); a case with `attention` throws when
// there is none for the backend's device (check case_cannot_run first).
Evaluation evaluate(Backend& backend, const OpCase& c, const CaseData& data, Mode mode, bool backward);

// Why case `c` cannot run on `backend` (an attention case, and no attention kernel computes on
// its device), or nullopt.
std::optional<std::string> case_cannot_run(Backend& backend, const OpCase& c);

// The seed gradient of output i, a pure function of its shape and index.
Tensor output_seed(const Shape& shape, std::size_t index);

}  // namespace loom::test
