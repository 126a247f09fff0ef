// Devices and buffer types: where a tensor's memory is, and who may touch it.
//
// Every Tensor's storage comes from a BufferType (ggml's ggml_backend_buffer_type): an
// allocator of blocks in one device's memory, with the copies in and out of it. The core owns
// the host buffer type (host_buffer_type(): the caching allocator of allocator.hpp); a backend
// whose memory the host cannot address (a GPU, or the test suite's `guarded` backend) brings its
// own and returns it from Backend::buffer_type().
//
// The rules:
//  * A tensor knows its device (Tensor::device()); its storage records the buffer type that
//    allocated it and is returned to it.
//  * Host code reads and writes only host-visible memory: Tensor::data<T>() of any other tensor
//    throws. Data move between devices only through explicit copies (Tensor::to,
//    Tensor::copy_from, to_vector, item), which call the buffer type's copy functions.
//  * An operation runs on one backend and takes and returns tensors in that backend's buffer
//    type (see autograd.hpp); the core refuses a tensor from elsewhere with a message naming the
//    operation and both devices.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom {

// A device: the name of its buffer type ("host", "guarded", "cuda") and an index among the
// devices of that type. A small value (no heap); names are at most 23 characters.
class Device {
 public:
  // The host.
  Device() : name_{'h', 'o', 's', 't'}, length_(4) {}
  // Throws InternalError for an empty name, a name longer than 23 characters or a negative
  // index.
  explicit Device(std::string_view type, int index = 0);
  static Device host() { return Device(); }

  std::string_view type() const { return {name_.data(), length_}; }
  int index() const { return index_; }
  bool is_host() const { return type() == "host"; }
  // "host", "guarded:0".
  std::string str() const;

  friend bool operator==(const Device& a, const Device& b) { return a.index_ == b.index_ && a.type() == b.type(); }

 private:
  std::array<char, 24> name_{};
  std::uint8_t length_ = 0;
  int index_ = 0;
};

class BufferType;

// A device's memory as its driver reports it right now (BufferType::memory).
struct DeviceMemory {
  std::int64_t free_bytes = 0;
  std::int64_t total_bytes = 0;
};

// A block of memory some tensors share, with its reference count. Buffer types allocate it
// (usually as the first member of a larger record of their own) and get it back when the last
// Tensor lets go.
struct Storage {
  std::atomic<std::int64_t> refs{0};
  // Start of the block in the buffer type's address space: a host pointer when host_visible,
  // otherwise an address only the buffer type and its backend may use.
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  BufferType* type = nullptr;
  // Copied from type->host_visible() at allocation, so that Tensor::data<T>() checks it inline.
  bool host_visible = true;
};

// An allocator of one device's memory and the copies in and out of it. Implementations are
// thread-safe and live until the process exits (a tensor may be released at any time: keep the
// object in static storage of a plugin, which is never unloaded, or in the core).
//
// Offsets and sizes are in bytes. Copy functions are called with ranges inside live blocks of
// this type; they run synchronously (the data are in place when they return).
class BufferType {
 public:
  virtual ~BufferType();

  virtual Device device() const = 0;
  // True when host code may read and write the memory through plain pointers (then data<T>()
  // works and the copies are memcpy).
  virtual bool host_visible() const = 0;

  // A block of at least `bytes` (0 is allowed), 64-byte aligned, with refs == 1, type == this
  // and host_visible set. Throws std::bad_alloc (or an Error) when the device is out of memory.
  virtual Storage* allocate(std::size_t bytes) = 0;
  // Takes back a block whose last reference was dropped.
  virtual void release(Storage* storage) noexcept = 0;

  // host[0, bytes) <- src.data[offset, offset + bytes)
  virtual void copy_to_host(void* host, const Storage& src, std::size_t offset, std::size_t bytes) = 0;
  // dst.data[offset, offset + bytes) <- host[0, bytes)
  virtual void copy_from_host(Storage& dst, std::size_t offset, const void* host, std::size_t bytes) = 0;
  // Between two blocks of this type; the ranges may overlap (memmove semantics).
  virtual void copy(Storage& dst, std::size_t dst_offset, const Storage& src, std::size_t src_offset,
                    std::size_t bytes) = 0;
  // dst.data[offset, offset + bytes) <- 0
  virtual void fill_zero(Storage& dst, std::size_t offset, std::size_t bytes) = 0;

  // The device's free and total memory (a GPU's cudaMemGetInfo), which the trainer's memory
  // check (trainer.memory_check) compares its estimate with. Nullopt, the default, means the
  // memory is the host's: the check then reads the host's (the cgroup limit, MemAvailable).
  virtual std::optional<DeviceMemory> memory() const { return std::nullopt; }
};

// The core's host memory: the caching allocator of allocator.hpp. Registered from the start.
BufferType& host_buffer_type();

// Makes `type` findable by its device (Tensor::to(device), Tensor::empty(shape, dtype, device)).
// A buffer type registers itself once, when it is created; registering the same object again is
// a no-op, another object for a registered device is an InternalError.
void register_buffer_type(BufferType& type);
// The registered buffer type of `device`; InternalError naming the registered devices when none.
BufferType& buffer_type_of(const Device& device);

// ---- Host<->device copies
// The core counts every copy between host-visible memory and memory the host cannot address:
// each Tensor::copy_from between the two (however it is staged), and so everything that copies
// through it (Tensor::to, to_vector, to_int_vector, item, the operations' host checks of ids and
// targets). A device-clean training step copies only at its edges (the batch in, the scalars of
// the log out): the count per step shows it, and tests assert it. Copies within one device
// (BufferType::copy) and between host-visible memories are not counted. Process-wide and
// thread-safe.
struct HostDeviceCopies {
  std::uint64_t count = 0;  // copies
  std::uint64_t bytes = 0;  // bytes of the elements copied
};
// The copies since the process started or since the last reset.
HostDeviceCopies host_device_copies();
// The copies so far, and the count starts again from zero (a trainer calls it once per step).
HostDeviceCopies reset_host_device_copies();

}  // namespace loom
