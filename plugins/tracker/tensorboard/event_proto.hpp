// TensorBoard's Event protocol buffers (tensorboard/compat/proto/event.proto, summary.proto,
// tensor.proto), encoded by hand in the protobuf wire format so that loom needs no protobuf
// library. Only what the tracker writes is covered:
//
//   Event          { double wall_time = 1; int64 step = 2; oneof { string file_version = 3;
//                    Summary summary = 5; SessionLog session_log = 7; } }
//   SessionLog     { SessionStatus status = 1; }                      START = 1
//   Summary        { repeated Value value = 1; }
//   Summary.Value  { string tag = 1; float simple_value = 2; TensorProto tensor = 8;
//                    SummaryMetadata metadata = 9; }
//   SummaryMetadata { PluginData plugin_data = 1; }   PluginData { string plugin_name = 1; }
//   TensorProto    { DataType dtype = 1; TensorShapeProto tensor_shape = 2;
//                    repeated bytes string_val = 8; }                  DT_STRING = 7
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::tensorboard {

// The first event of every file: file_version "brain.Event:2".
std::string file_version_event(double wall_time, std::int64_t step);

// SessionLog START at `step`: TensorBoard discards what it read earlier at steps >= `step`, which
// is how a resumed run hides what its previous part wrote after the checkpoint it resumed from.
std::string session_start_event(double wall_time, std::int64_t step);

// Scalars as Summary values with simple_value (a float, as TensorBoard stores them).
std::string scalars_event(double wall_time, std::int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars);

// A text sample as the text plugin writes it: a scalar DT_STRING tensor with plugin_name "text".
std::string text_event(double wall_time, std::int64_t step, std::string_view tag, std::string_view text);

}  // namespace loom::tensorboard
