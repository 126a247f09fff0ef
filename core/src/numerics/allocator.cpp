// The caching tensor allocator (allocator.hpp): size classes, intrusive free lists, no memory
// returned to the system until allocator_release_cached(). It is the host's buffer type
// (device.hpp), and this file also keeps the table of registered buffer types.
#include "loom/allocator.hpp"

#include <sys/mman.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "loom/core/storage.hpp"
#include "loom/error.hpp"
#include "numerics/allocator_impl.hpp"
#include "numerics/tape.hpp"

namespace loom {
namespace detail {

namespace {

constexpr std::size_t small_alignment = 64;         // a cache line; AVX-512 loads
constexpr std::size_t huge_alignment = 2u << 20;    // a transparent huge page
constexpr std::size_t huge_threshold = 4u << 20;    // blocks this large get huge pages
constexpr std::size_t classes_per_octave_log2 = 5;  // 32 classes per power of two

struct Block final : Storage {
  std::size_t size_class = 0;
  Block* next_free = nullptr;
  // A huge block is its own anonymous mapping (zero when fresh): [mapping, mapping + mapped).
  void* mapping = nullptr;
  std::size_t mapped = 0;
};

// The smallest class >= bytes: multiples of 64 bytes up to 2 KiB, then 32 classes per power of
// two (at most 1/32 above the request).
std::size_t size_class(std::size_t bytes) {
  if (bytes <= small_alignment) return small_alignment;
  const unsigned width = std::bit_width(bytes - 1);  // bytes <= 2^width
  std::size_t granularity = (std::size_t{1} << width) >> classes_per_octave_log2;
  if (granularity < small_alignment) granularity = small_alignment;
  return (bytes + granularity - 1) / granularity * granularity;
}

class CachingAllocator final : public BufferType {
 public:
  Device device() const override { return Device::host(); }
  bool host_visible() const override { return true; }
  Storage* allocate(std::size_t bytes) override { return allocate_block(bytes, false); }
  void release(Storage* storage) noexcept override { release_block(static_cast<Block*>(storage)); }
  void copy_to_host(void* host, const Storage& src, std::size_t offset, std::size_t bytes) override {
    if (bytes) std::memcpy(host, src.data + offset, bytes);
  }
  void copy_from_host(Storage& dst, std::size_t offset, const void* host, std::size_t bytes) override {
    if (bytes) std::memcpy(dst.data + offset, host, bytes);
  }
  void copy(Storage& dst, std::size_t dst_offset, const Storage& src, std::size_t src_offset,
            std::size_t bytes) override {
    if (bytes) std::memmove(dst.data + dst_offset, src.data + src_offset, bytes);
  }
  void fill_zero(Storage& dst, std::size_t offset, std::size_t bytes) override {
    if (bytes) std::memset(dst.data + offset, 0, bytes);
  }

  Block* allocate_block(std::size_t bytes, bool zeroed) {
    const std::size_t cls = size_class(bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.requests;
      if (auto it = free_.find(cls); it != free_.end() && it->second) {
        Block* b = it->second;
        it->second = b->next_free;
        b->next_free = nullptr;
        ++stats_.cache_hits;
        stats_.bytes_cached -= cls;
        note_in_use(cls);
        b->refs.store(1, std::memory_order_relaxed);
        if (zeroed && bytes) std::memset(b->data, 0, bytes);
        return b;
      }
      ++stats_.system_allocations;
      note_in_use(cls);
    }
    // The system allocation happens outside the lock. A huge block is an anonymous mapping of its
    // own, aligned to a huge page: fresh, it reads zero without a page of it being allocated, and
    // it is not charged against the commit limit (MAP_NORESERVE): a model larger than memory whose
    // frozen weights go straight into fewer bits (lora.base_dtype) never writes its float32
    // buffer. What is written must fit: the start-up memory estimate refuses a run that would not.
    const bool huge = cls >= huge_threshold;
    void* data = nullptr;
    void* mapping = nullptr;
    std::size_t mapped = 0;
    if (huge) {
      const std::size_t rounded = (cls + huge_alignment - 1) / huge_alignment * huge_alignment;
      mapped = rounded + huge_alignment;
      mapping = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (mapping == MAP_FAILED) {
        mapping = nullptr;
      } else {
        const auto base = reinterpret_cast<std::uintptr_t>(mapping);
        data = reinterpret_cast<void*>((base + huge_alignment - 1) / huge_alignment * huge_alignment);
        ::madvise(data, rounded, MADV_HUGEPAGE);
      }
    } else {
      data = std::aligned_alloc(small_alignment, (cls + small_alignment - 1) / small_alignment * small_alignment);
      if (data && zeroed && bytes) std::memset(data, 0, bytes);
    }
    if (!data) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.bytes_in_use -= cls;
      throw std::bad_alloc();
    }
    auto* b = new Block;
    b->data = static_cast<std::byte*>(data);
    b->bytes = cls;
    b->size_class = cls;
    b->type = this;
    b->host_visible = true;
    b->mapping = mapping;
    b->mapped = mapped;
    b->refs.store(1, std::memory_order_relaxed);
    return b;
  }

  void release_block(Block* b) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.releases;
    stats_.bytes_in_use -= b->size_class;
    stats_.bytes_cached += b->size_class;
    // operator[] may allocate a bucket, but only the first time a class is ever released.
    Block*& head = free_[b->size_class];
    b->next_free = head;
    head = b;
  }

  // `b` keeps its identity (the tensors that refer to it) and takes a fresh block of `bytes`;
  // its old block goes to the cache. Everything that describes the memory moves (a huge block's
  // mapping too), only the Storage object stays.
  void rebind_block(Block* b, std::size_t bytes) {
    Block* fresh = allocate_block(bytes, /*zeroed=*/false);
    std::swap(b->data, fresh->data);
    std::swap(b->bytes, fresh->bytes);
    std::swap(b->size_class, fresh->size_class);
    std::swap(b->mapping, fresh->mapping);
    std::swap(b->mapped, fresh->mapped);
    release_block(fresh);
  }

  void release_cached() {
    std::unordered_map<std::size_t, Block*> victims;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      victims.swap(free_);
      stats_.bytes_cached = 0;
    }
    for (auto& [cls, head] : victims) {
      while (head) {
        Block* next = head->next_free;
        if (head->mapping)
          ::munmap(head->mapping, head->mapped);
        else
          std::free(head->data);
        delete head;
        head = next;
      }
    }
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

 private:
  void note_in_use(std::size_t cls) {
    stats_.bytes_in_use += cls;
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

  std::mutex mutex_;
  std::unordered_map<std::size_t, Block*> free_;
  AllocatorStats stats_;
};

// Never destroyed: tensors in static storage may be released after main returns.
CachingAllocator& allocator() {
  static auto* instance = new CachingAllocator;
  return *instance;
}

// The registered buffer types, the host's first. Never destroyed, like the allocator.
struct BufferTypeTable {
  std::mutex mutex;
  std::vector<BufferType*> types{&allocator()};
};
BufferTypeTable& buffer_types() {
  static auto* table = new BufferTypeTable;
  return *table;
}

}  // namespace

Storage* allocate_storage(std::size_t bytes, bool zeroed) {
  return allocator().allocate_block(bytes, zeroed);
}

}  // namespace detail

namespace core {
void rebind_host_storage(const Tensor& t, std::size_t bytes) {
  Storage* s = detail::TensorAccess::storage(t);
  if (!s || s->type != &detail::allocator())
    throw InternalError("rebind_host_storage: " + t.str() + " is not in the host's caching allocator");
  detail::allocator().rebind_block(static_cast<detail::Block*>(s), bytes);
}
}  // namespace core

BufferType::~BufferType() = default;

BufferType& host_buffer_type() {
  return detail::allocator();
}

void register_buffer_type(BufferType& type) {
  const Device device = type.device();
  auto& table = detail::buffer_types();
  std::lock_guard<std::mutex> lock(table.mutex);
  for (BufferType* t : table.types) {
    if (t == &type) return;
    if (t->device() == device)
      throw InternalError("a second buffer type for device " + device.str() + " was registered");
  }
  table.types.push_back(&type);
}

BufferType& buffer_type_of(const Device& device) {
  auto& table = detail::buffer_types();
  std::lock_guard<std::mutex> lock(table.mutex);
  std::string known;
  for (BufferType* t : table.types) {
    if (t->device() == device) return *t;
    known += (known.empty() ? "" : ", ") + t->device().str();
  }
  throw InternalError("no buffer type is registered for device " + device.str() + " (registered: " + known +
                      "); a backend registers its buffer type when it is created");
}

AllocatorStats allocator_stats() {
  return detail::allocator().stats();
}
void allocator_release_cached() {
  detail::allocator().release_cached();
}
void allocator_reset_peak() {
  detail::allocator().reset_peak();
}

}  // namespace loom
