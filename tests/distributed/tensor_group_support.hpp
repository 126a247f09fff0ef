// What the in-process tensor-parallel tests share: the collective every rank of `mpirun -np N`
// joins (LOOM_TEST_COLLECTIVE=mpi; `single`, a group of one, without it) and the cpu backend in
// float32 products, so that the split and the whole computations differ by summation order alone.
#pragma once

#include <cstdlib>
#include <string>

#include "loom/kinds/backend.hpp"
#include "loom/kinds/collective.hpp"
#include "numerics_test_support.hpp"

namespace loom::test::tensor_group {

inline Collective& collective() {
  static Handle<Collective> handle = [] {
    const char* env = std::getenv("LOOM_TEST_COLLECTIVE");
    const std::string name = env ? env : "single";
    return plugin_registry().create<Collective>({"collective", name, Value(name), "collective"});
  }();
  return *handle;
}

inline Backend& backend() {
  static Handle<Backend> b = make_f32_backend("cpu");
  return *b;
}

}  // namespace loom::test::tensor_group
