// A schedule whose rate is the peak times a BLAS dot product (1*3 + 2*4 = 11): a plugin that calls
// the BLAS find_package(Loom) exports.
#include <cblas.h>

#include <loom/kinds/lr_schedule.hpp>
#include <loom/plugin.hpp>
#include <memory>

namespace {

class Dot final : public loom::LrSchedule {
 public:
  double learning_rate(std::int64_t, std::int64_t, double peak) const override {
    const float a[2] = {1, 2}, b[2] = {3, 4};
    return peak * cblas_sdot(2, a, 1, b, 1);
  }
};

void register_components(loom::Registrar& r) {
  r.add<loom::LrSchedule>({.name = LOOM_TEST_NAME, .description = "a BLAS dot product", .version = "1.0.0"},
                          [](const loom::Options&, const loom::CreateContext&) { return std::make_unique<Dot>(); });
}

}  // namespace

LOOM_PLUGIN(register_components)
