#include "event_proto.hpp"

#include <bit>

namespace loom::tensorboard {

namespace {

// Appends fields in the protobuf wire format.
class ProtoWriter {
 public:
  void varint_field(int field, std::uint64_t v) {
    tag(field, 0);
    varint(v);
  }
  void double_field(int field, double v) {
    tag(field, 1);
    little_endian(std::bit_cast<std::uint64_t>(v), 8);
  }
  void float_field(int field, float v) {
    tag(field, 5);
    little_endian(std::bit_cast<std::uint32_t>(v), 4);
  }
  void bytes_field(int field, std::string_view bytes) {
    tag(field, 2);
    varint(bytes.size());
    out_.append(bytes);
  }
  void message_field(int field, const ProtoWriter& message) { bytes_field(field, message.out_); }

  const std::string& bytes() const { return out_; }

 private:
  void tag(int field, int wire_type) { varint((static_cast<std::uint64_t>(field) << 3) | wire_type); }
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void little_endian(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  std::string out_;
};

// Event field numbers.
constexpr int kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7;

ProtoWriter event_header(double wall_time, std::int64_t step) {
  ProtoWriter event;
  event.double_field(kWallTime, wall_time);
  // int64 is a plain varint of the two's-complement value (negative steps never occur).
  event.varint_field(kStep, static_cast<std::uint64_t>(step));
  return event;
}

}  // namespace

std::string file_version_event(double wall_time, std::int64_t step) {
  ProtoWriter event = event_header(wall_time, step);
  event.bytes_field(kFileVersion, "brain.Event:2");
  return event.bytes();
}

std::string session_start_event(double wall_time, std::int64_t step) {
  ProtoWriter session_log;
  session_log.varint_field(1, 1);  // status = START
  ProtoWriter event = event_header(wall_time, step);
  event.message_field(kSessionLog, session_log);
  return event.bytes();
}

std::string scalars_event(double wall_time, std::int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars) {
  ProtoWriter summary;
  for (const auto& [tag, value] : scalars) {
    ProtoWriter v;
    v.bytes_field(1, tag);
    v.float_field(2, static_cast<float>(value));
    summary.message_field(1, v);
  }
  ProtoWriter event = event_header(wall_time, step);
  event.message_field(kSummary, summary);
  return event.bytes();
}

std::string text_event(double wall_time, std::int64_t step, std::string_view tag, std::string_view text) {
  ProtoWriter shape;  // a scalar: no dimensions
  ProtoWriter tensor;
  tensor.varint_field(1, 7);  // dtype = DT_STRING
  tensor.message_field(2, shape);
  tensor.bytes_field(8, text);  // string_val
  ProtoWriter plugin_data;
  plugin_data.bytes_field(1, "text");  // plugin_name
  ProtoWriter metadata;
  metadata.message_field(1, plugin_data);
  ProtoWriter value;
  value.bytes_field(1, tag);
  value.message_field(8, tensor);
  value.message_field(9, metadata);
  ProtoWriter summary;
  summary.message_field(1, value);
  ProtoWriter event = event_header(wall_time, step);
  event.message_field(kSummary, summary);
  return event.bytes();
}

}  // namespace loom::tensorboard
