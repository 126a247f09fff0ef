// collective `single`: a run of one process, the default. Every operation is the identity (an
// all-reduce over one rank is its input), so the trainer has one code path for one rank and many.
// Every group of one process is that process alone, with the same operations.
#include <algorithm>
#include <memory>
#include <string>

#include "loom/error.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/plugin.hpp"

namespace {

// The operations of a group of one rank, for the world (Interface = loom::Collective) and its
// groups (loom::CollectiveGroup).
template <class Interface>
class OneRank : public Interface {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

  void all_reduce(std::span<float>, loom::ReduceOp) override {}
  void all_reduce(std::span<double>, loom::ReduceOp) override {}
  void reduce_scatter(std::span<const float> in, std::span<float> out) override {
    check_sizes("reduce_scatter", in.size(), out.size());
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
  }
  void all_gather(std::span<const float> in, std::span<float> out) override {
    check_sizes("all_gather", in.size(), out.size());
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
  }
  void broadcast(std::span<std::byte>, int root) override {
    if (root != 0) throw loom::InternalError("single: broadcast from rank " + std::to_string(root) + " of 1");
  }
  void barrier() override {}

  std::unique_ptr<loom::CollectiveGroup::Pending> start_all_reduce(std::span<float>) override {
    return std::make_unique<Done>();
  }

 private:
  struct Done final : loom::CollectiveGroup::Pending {
    void wait() override {}
  };
  static void check_sizes(const char* operation, std::size_t in, std::size_t out) {
    if (in != out)
      throw loom::InternalError(std::string("single: ") + operation + " of " + std::to_string(in) + " floats into " +
                                std::to_string(out) + " on 1 rank");
  }
};

class SingleCollective final : public OneRank<loom::Collective> {
 public:
  std::string describe() const override { return "one process"; }
  std::shared_ptr<loom::CollectiveGroup> split(int color, int) override {
    if (color < 0) throw loom::InternalError("single: split with colour " + std::to_string(color) + " (must be >= 0)");
    return std::make_shared<OneRank<loom::CollectiveGroup>>();
  }
};

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Collective>(
      {.name = "single",
       .description = "one process: every collective is the identity (the default outside mpirun)",
       .version = "1.1.0"},
      [](const loom::Options&, const loom::CreateContext&) { return std::make_unique<SingleCollective>(); });
}

}  // namespace

LOOM_PLUGIN(register_components)
