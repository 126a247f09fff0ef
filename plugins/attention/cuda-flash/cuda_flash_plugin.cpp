// attention/cuda-flash: registration and options. This library links no CUDA library: it loads on
// any machine (`loom plugins` lists the kernel everywhere), and creating the kernel loads its
// kernels' library (cuda-flash-kernels.so beside it, linked to the CUDA runtime) on first use, as
// plugins/backend/cuda does. Without a GPU, a driver or the CUDA runtime, creation throws
// loom::DeviceUnavailable: `model.attention: auto` then passes the kernel over, naming it
// explicitly is refused with that message (exit 2), and the conformance suite skips it.
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <loom/error.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <string>

namespace {

using MakeKernel = loom::AttentionKernel*(int device);

MakeKernel* kernels_factory() {
  static MakeKernel* const factory = [] {
    const boost::dll::fs::path path = boost::dll::this_line_location().parent_path() / LOOM_CUDA_FLASH_KERNELS_LIBRARY;
    if (!boost::dll::fs::exists(path))
      throw loom::InternalError("attention cuda-flash: its kernels' library " + path.string() +
                                " is missing; reinstall loom (or rebuild it with the CUDA toolkit)");
    static boost::dll::shared_library library;
    try {
      library.load(path, boost::dll::load_mode::rtld_local | boost::dll::load_mode::rtld_now);
    } catch (const std::exception& e) {
      // The CUDA runtime is not installed here (libcudart.so.13): the machine cannot run it.
      throw loom::DeviceUnavailable("attention cuda-flash: the CUDA libraries its kernels need cannot be loaded (" +
                                    std::string(e.what()) +
                                    "); install the CUDA 13 runtime (docs/cuda.md), or use a host backend");
    }
    return &library.get<MakeKernel>("loom_cuda_flash_kernel");
  }();
  return factory;
}

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.integer("device", 0,
            "The CUDA device (an index among the machine's GPUs, as CUDA numbers them): the cuda backend's "
            "backend.device.")
      .min(0);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::AttentionKernel>(
      {.name = "cuda-flash",
       .description = "FlashAttention-2 on an NVIDIA GPU: online softmax, recomputing backward, bf16 tensor cores "
                      "or float32",
       .version = "0.1.0",
       .options = options(),
       .preference = 100},  // the fast kernel of cuda:N: what `model.attention: auto` picks there
      [](const loom::Options& o, const loom::CreateContext&) {
        return std::unique_ptr<loom::AttentionKernel>(
            kernels_factory()(static_cast<int>(o.get<std::int64_t>("device"))));
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
