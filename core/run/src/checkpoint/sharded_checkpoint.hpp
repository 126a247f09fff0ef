// Checkpoints that several ranks write, each its own part, and the reader that assembles any part
// of any tensor from them (docs/checkpoints.md#sharded-checkpoints).
//
// A checkpoint's tensors come in two groups, "model" and "optimizer". One process (or rank 0 of
// a data-parallel run, whose ranks hold replicas) writes each group whole into
// <group>.safetensors. When the ranks hold different parts (ZeRO-1's optimizer state, FSDP's
// parameters), each of the N ranks writes <group>.rank-<r>-of-<N>.safetensors (rank_file_name),
// holding the entries it owns: an entry whole under its name, or a slice, elements [begin, end)
// of the entry's flat row-major values, stored as a 1-D tensor under the entry's name. Each rank
// file's "loom.entries" metadata records every entry's global shape and range:
//   {"h.0.attn.c_attn.weight": {"shape": [64, 192], "begin": 0, "end": 6144}, ...}
// so the files describe themselves: the reader needs no mesh and no knowledge of how the ranks
// split the tensors, and a checkpoint written on one mesh is read on any other.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/kinds/model.hpp"
#include "loom/safetensors.hpp"
#include "loom/tensor.hpp"

namespace loom::checkpoint {

// One tensor of a snapshot: a whole entry, or elements [begin, end) of its flat values.
struct Entry {
  std::string name;
  Tensor data;                       // whole: shaped global_shape; a slice: end - begin elements, any shape
  Shape global_shape;                // the whole entry's shape
  std::int64_t begin = 0, end = -1;  // end -1: the whole entry

  Entry() = default;
  // The whole of `data`.
  Entry(std::string name, Tensor data);
  // Elements [begin, end) of an entry shaped `global_shape`; `data` holds end - begin elements.
  Entry(std::string name, Tensor data, Shape global_shape, std::int64_t begin, std::int64_t end);
  bool whole() const { return end < 0 || (begin == 0 && end == global_shape.numel()); }
  std::int64_t stop() const { return end < 0 ? global_shape.numel() : end; }
};

// Writes `entries` as one rank's file of a sharded checkpoint (fsynced, atomically: safetensors::save),
// with their shapes and ranges in the "loom.entries" metadata beside `metadata`. A rank that owns
// nothing writes a file without tensors. InternalError for a range outside its entry or data of
// another size.
void save_rank_file(const std::filesystem::path& path, std::span<const Entry> entries,
                    std::map<std::string, std::string> metadata = {});

// Whether checkpoint directory `dir` holds its tensors in rank files.
bool is_sharded_checkpoint(const std::filesystem::path& dir);

// One group of a checkpoint's tensors, whole or in parts, from wherever they are: the single
// file, or the rank files of any number of ranks. Reads may come from any thread.
class TensorSet {
 public:
  struct Info {
    std::string name;
    Shape shape;  // the whole entry's
    DType dtype = DType::f32;
  };

  // Group `group` ("model", "optimizer") of checkpoint `dir`: <group>.safetensors, else its rank
  // files, all N of them. UserError when neither is there, a rank file is missing or unreadable,
  // or the files disagree on an entry's shape.
  TensorSet(const std::filesystem::path& dir, std::string group);
  // A plain safetensors file (a run's final weights), or, for <dir>/<group>.safetensors that is
  // not there, the rank files of a sharded checkpoint in <dir>.
  static TensorSet open(const std::filesystem::path& file);

  const std::filesystem::path& dir() const { return dir_; }
  int shards() const { return shards_; }  // 0: one file
  // "'runs/a/checkpoints/step-10/model.safetensors'", or "checkpoint 'runs/a/checkpoints/step-10'
  // (model.rank-*-of-00002.safetensors)": where the tensors are, for messages.
  std::string describe() const;
  // The first file's metadata (every rank file carries the same run metadata).
  const std::map<std::string, std::string>& metadata() const;

  const std::vector<Info>& entries() const { return entries_; }  // by name
  bool contains(const std::string& name) const { return index_.contains(name); }
  // UserError naming the checkpoint when there is no entry `name`.
  const Info& info(const std::string& name) const;

  // Elements [begin, end) of entry `name`'s flat values, as a 1-D tensor, assembled from the
  // files that hold them. UserError naming the checkpoint, the entry and the elements no file
  // holds when the files do not cover the range.
  Tensor read_range(const std::string& name, std::int64_t begin, std::int64_t end) const;
  // The same into `destination` (end - begin elements, any shape, strides or device).
  void read_range_into(const std::string& name, std::int64_t begin, std::int64_t end, const Tensor& destination) const;
  // Throws read_range's error when the files do not cover the range; reads nothing. For a
  // caller that checks every part it will read before it changes anything.
  void check_covered(const std::string& name, std::int64_t begin, std::int64_t end) const;
  // The whole entry, in its shape.
  Tensor read(const std::string& name) const;
  // The whole entry into `destination` (its shape, f32 for F32, BF16 or F16 data).
  void read_into(const std::string& name, const Tensor& destination) const;
  // As safetensors::load_parameters: the set must hold exactly the parameters, by name and shape;
  // one UserError naming every missing, extra and mis-shaped one, and nothing is modified then.
  void load_parameters(std::span<const ModelParameter> parameters) const;

 private:
  TensorSet() = default;
  void add_file(const std::filesystem::path& path, bool rank_file);
  struct Piece;
  // Calls `copy(piece, first, last)` for consecutive parts [first, last) of [begin, end), each
  // held by `piece`; throws naming the first elements that no file holds.
  void walk(const std::string& name, std::int64_t begin, std::int64_t end,
            const std::function<void(const Piece&, std::int64_t, std::int64_t)>& copy) const;
  struct Piece {
    std::size_t reader = 0;
    std::int64_t begin = 0, end = 0;
  };
  std::filesystem::path dir_;
  std::string group_;
  std::filesystem::path single_;  // the one file, when not sharded
  int shards_ = 0;
  std::vector<safetensors::Reader> readers_;
  std::vector<Info> entries_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::vector<Piece>> pieces_;  // by begin
};

}  // namespace loom::checkpoint
