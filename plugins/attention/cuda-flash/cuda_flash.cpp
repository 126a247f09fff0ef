// attention/cuda-flash: the kernel object (kinds/attention.hpp) over flash_kernels.cu, and the
// entry point of cuda-flash-kernels.so. Compiled by the C++ compiler; linked to the CUDA runtime
// only (shared, so that streams and memory are the backend's: one runtime in the process).
//
// Where it runs: on the `cuda` backend's stream of its device, which it asks the backend's
// kernels' library for (cuda-backend-kernels.so beside it, `loom_cuda_stream`: the backend's
// context, created there on first use with its buffer type registered). So its kernels queue in
// order with the backend's, and its scratch (delta, [batch, q_heads, q_len] floats) is a Tensor in
// `cuda:N` memory: the backend's stream-ordered pool, freed on that stream after the kernels that
// read it.
#include <cuda_runtime.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <loom/error.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/tensor.hpp>
#include <mutex>
#include <string>
#include <vector>

#include "flash_launch.hpp"
#include "flash_math.hpp"

namespace loom::cuda_flash {

namespace {

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess)
    throw InternalError(std::string("attention cuda-flash: ") + what + " failed: " + cudaGetErrorName(error) + " (" +
                        cudaGetErrorString(error) + ")");
}

// The symbol and library of plugins/backend/cuda (its cuda_options.hpp: LOOM_CUDA_STREAM_ENTRY).
constexpr const char* backend_library = "cuda-backend-kernels.so";
constexpr const char* stream_entry = "loom_cuda_stream";

// Without a usable device this throws DeviceUnavailable before anything else is loaded, so that
// `model.attention: auto` on a machine without a GPU costs one cudaGetDeviceCount.
cudaDeviceProp usable_device(int device) {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  if (probe != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    throw DeviceUnavailable(std::string("attention cuda-flash: no CUDA device is available (cudaGetDeviceCount: ") +
                            (probe != cudaSuccess
                                 ? std::string(cudaGetErrorName(probe)) + ", " + cudaGetErrorString(probe)
                                 : std::string("0 devices")) +
                            "): this machine has no NVIDIA GPU, or no driver for it; with a host backend, "
                            "use model.attention: auto or flash");
  }
  if (device >= count)
    throw UserError("attention cuda-flash: device is " + std::to_string(device) + ", but this machine has " +
                    std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s") + ": use 0 to " +
                    std::to_string(count - 1));
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  if (properties.major < 8)
    throw DeviceUnavailable("attention cuda-flash: device " + std::to_string(device) + " (" + properties.name +
                            ") has compute capability " + std::to_string(properties.major) + "." +
                            std::to_string(properties.minor) + "; its kernels need 8.0 or newer");
  return properties;
}

cudaStream_t backend_stream(int device) {
  static std::mutex mutex;
  static boost::dll::shared_library library;  // never unloaded
  std::lock_guard<std::mutex> lock(mutex);
  if (!library.is_loaded()) {
    const boost::dll::fs::path path = boost::dll::this_line_location().parent_path() / backend_library;
    if (!boost::dll::fs::exists(path))
      throw DeviceUnavailable("attention cuda-flash: it runs on the cuda backend's stream, but " + path.string() +
                              " (plugins/backend/cuda) is missing; reinstall loom");
    try {
      library.load(path, boost::dll::load_mode::rtld_local | boost::dll::load_mode::rtld_now);
    } catch (const std::exception& e) {
      throw DeviceUnavailable("attention cuda-flash: the cuda backend's library cannot be loaded (" +
                              std::string(e.what()) + "); install the CUDA 13 runtime and cuBLAS (docs/cuda.md)");
    }
  }
  return static_cast<cudaStream_t>(library.get<void*(int)>(stream_entry)(device));
}

// Once per device: every kernel may have the shared memory it asks for.
void prepare(int device) {
  static std::mutex mutex;
  static std::vector<bool> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (done.size() <= static_cast<std::size_t>(device)) done.resize(static_cast<std::size_t>(device) + 1);
  if (done[static_cast<std::size_t>(device)]) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  prepare_kernels();
  done[static_cast<std::size_t>(device)] = true;
}

class CudaFlashAttention final : public AttentionKernel {
 public:
  explicit CudaFlashAttention(int device) : device_(device) {
    const cudaDeviceProp properties = usable_device(device);
    int optin = 0;
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          "cudaDeviceGetAttribute (shared memory per block)");
    shared_limit_ = optin;
    name_ = properties.name;
    stream_ = backend_stream(device);
    // The kernels' shared memory: every kernel fits an A100's 163 KiB, but a GPU that allows less
    // is refused here, naming what it lacks.
    for (const bool bf16 : {false, true})
      for (const int64_t d : {64, 128, 256})
        if (shared_bytes_needed(d, bf16) > shared_limit_)
          throw DeviceUnavailable("attention cuda-flash: device " + std::to_string(device) + " (" + name_ +
                                  ") allows " + std::to_string(shared_limit_) +
                                  " bytes of shared memory per block; its kernels need up to " +
                                  std::to_string(shared_bytes_needed(d, bf16)));
    prepare(device);
  }

  Device device() const override { return Device("cuda", device_); }

  void forward(const AttentionForwardArgs& a) override {
    if (a.batch == 0 || a.q_heads == 0 || a.q_len == 0) return;
    const Problem p = problem(a);
    check(cudaSetDevice(device_), "cudaSetDevice");
    launch_forward(stream_, p);
  }

  void backward(const AttentionBackwardArgs& args) override {
    const AttentionForwardArgs& a = *args.forward;
    if (a.batch == 0 || a.kv_heads == 0 || (!args.dq.data && !args.dk.data && !args.dv.data)) return;
    const Problem p = problem(a);
    check(cudaSetDevice(device_), "cudaSetDevice");
    const int64_t rows = a.batch * a.q_heads * a.q_len;
    const Tensor delta = Tensor::empty(Shape{rows > 0 ? rows : 1}, DType::f32, device());
    BackwardProblem g;
    g.dout = args.dout;
    g.delta = delta.device_data<float>();
    g.dq = {args.dq.data, args.dq.batch_stride, args.dq.token_stride, args.dq.accumulate};
    g.dk = {args.dk.data, args.dk.batch_stride, args.dk.token_stride, args.dk.accumulate};
    g.dv = {args.dv.data, args.dv.batch_stride, args.dv.token_stride, args.dv.accumulate};
    launch_backward(stream_, p, g);
    // delta returns to the pool on the stream, after the kernels that read it.
  }

 private:
  Problem problem(const AttentionForwardArgs& a) const {
    if (a.head_dim > max_head_dim)
      throw UserError("attention cuda-flash: head_dim " + std::to_string(a.head_dim) + " is above the " +
                      std::to_string(max_head_dim) +
                      " its kernels are built for (64, 128 and 256, smaller ones padded): use heads of at most " +
                      std::to_string(max_head_dim));
    if (a.batch > 65535 || a.q_heads > 65535)
      throw UserError("attention cuda-flash: batch " + std::to_string(a.batch) + " and " + std::to_string(a.q_heads) +
                      " query heads: each must be at most 65535 (a CUDA grid's dimension)");
    Problem p;
    p.batch = a.batch;
    p.q_len = a.q_len;
    p.kv_len = a.kv_len;
    p.q_heads = a.q_heads;
    p.kv_heads = a.kv_heads;
    p.head_dim = a.head_dim;
    p.q = a.q.data;
    p.k = a.k.data;
    p.v = a.v.data;
    p.q_batch_stride = a.q.batch_stride;
    p.q_token_stride = a.q.token_stride;
    p.k_batch_stride = a.k.batch_stride;
    p.k_token_stride = a.k.token_stride;
    p.v_batch_stride = a.v.batch_stride;
    p.v_token_stride = a.v.token_stride;
    p.q_segments = a.q_segments;
    p.kv_segments = a.kv_segments;
    p.causal = a.params.causal;
    p.window = a.params.window;
    p.softcap = a.params.softcap;
    p.scale = a.params.scale;
    p.bf16 = a.compute == DType::bf16;
    p.out = a.out;
    p.lse = a.lse;
    return p;
  }

  int device_;
  int64_t shared_limit_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

}  // namespace loom::cuda_flash

// The one entry point of cuda-flash-kernels.so (cuda_flash_plugin.cpp looks it up): the kernel
// on CUDA device `device`. Throws loom::DeviceUnavailable when this machine cannot run it.
extern "C" __attribute__((visibility("default"))) loom::AttentionKernel* loom_cuda_flash_kernel(int device) {
  return new loom::cuda_flash::CudaFlashAttention(device);
}
