// tracker `tensorboard`: CRC-32C against RFC 3720's vectors, TFRecord framing, and the event
// files the tracker writes parsed back record by record (framing, both CRCs of every record, the
// Event protobufs with a reader written here independently of the encoder); then, where a Python
// with TensorBoard is installed, the same files read by TensorBoard's own EventAccumulator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/kinds/tracker.hpp"
#include "reference_required.hpp"
#include "tfrecord.hpp"

namespace {

namespace fs = std::filesystem;
using loom::tensorboard::crc32c;
using loom::tensorboard::masked_crc32c;
using loom::tensorboard::tfrecord;

// ---- CRC-32C and framing ----

TEST(Crc32c, MatchesRfc3720Vectors) {
  // RFC 3720 (iSCSI), appendix B.4 "CRC Examples".
  EXPECT_EQ(crc32c(std::string(32, '\x00')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i)
    ascending.push_back(static_cast<char>(i)), descending.push_back(static_cast<char>(31 - i));
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  const unsigned char read_pdu[48] = {0x01, 0xC0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                      0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
                                      0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
                                      0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(crc32c(std::string(reinterpret_cast<const char*>(read_pdu), sizeof(read_pdu))), 0xD9963A56u);
  // The usual check value.
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(Crc32c, MaskedAsTensorBoardMasksIt) {
  // Values from TensorBoard's own masked_crc32c (tensorboard.compat.tensorflow_stub.pywrap_tensorflow).
  EXPECT_EQ(masked_crc32c("123456789"), 0xC78AB0E5u);
  EXPECT_EQ(masked_crc32c(std::string(8, '\x00')), 0x07980329u);
  EXPECT_EQ(masked_crc32c(std::string("\x18\0\0\0\0\0\0\0", 8)), 0x224B7FA3u);
}

std::uint64_t read_le(std::string_view bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return v;
}

TEST(TfRecord, FramesLengthAndBothCrcs) {
  const std::string r = tfrecord("abc");
  ASSERT_EQ(r.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(read_le(r.substr(0, 8)), 3u);
  EXPECT_EQ(read_le(r.substr(8, 4)), masked_crc32c(r.substr(0, 8)));
  EXPECT_EQ(r.substr(12, 3), "abc");
  EXPECT_EQ(read_le(r.substr(15, 4)), masked_crc32c("abc"));
}

// ---- An event-file reader, independent of the tracker's encoder ----

// The records of a TFRecord file; throws on a bad length, a truncated record or a CRC mismatch.
std::vector<std::string> read_records(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  std::size_t pos = 0;
  while (pos < data.size()) {
    if (data.size() - pos < 12) throw std::runtime_error("truncated record header at byte " + std::to_string(pos));
    const std::string_view header(data.data() + pos, 8);
    if (read_le(std::string_view(data.data() + pos + 8, 4)) != masked_crc32c(header))
      throw std::runtime_error("header CRC mismatch at byte " + std::to_string(pos));
    const std::uint64_t length = read_le(header);
    if (data.size() - pos - 12 < length + 4)
      throw std::runtime_error("truncated record at byte " + std::to_string(pos));
    const std::string payload = data.substr(pos + 12, length);
    if (read_le(std::string_view(data.data() + pos + 12 + length, 4)) != masked_crc32c(payload))
      throw std::runtime_error("data CRC mismatch at byte " + std::to_string(pos));
    records.push_back(payload);
    pos += 12 + length + 4;
  }
  return records;
}

// One field of a protobuf message: a varint, a fixed 64/32-bit value or length-delimited bytes.
struct Field {
  int number = 0;
  int wire_type = 0;
  std::uint64_t value = 0;  // varint and fixed types
  std::string bytes;        // length-delimited
};

std::vector<Field> parse_message(std::string_view m) {
  std::size_t pos = 0;
  auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (pos >= m.size() || shift > 63) throw std::runtime_error("bad varint");
      const auto b = static_cast<unsigned char>(m[pos++]);
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  std::vector<Field> fields;
  while (pos < m.size()) {
    const std::uint64_t key = varint();
    Field f;
    f.number = static_cast<int>(key >> 3);
    f.wire_type = static_cast<int>(key & 7);
    switch (f.wire_type) {
      case 0:
        f.value = varint();
        break;
      case 1:
        if (m.size() - pos < 8) throw std::runtime_error("truncated fixed64");
        f.value = read_le(m.substr(pos, 8)), pos += 8;
        break;
      case 5:
        if (m.size() - pos < 4) throw std::runtime_error("truncated fixed32");
        f.value = read_le(m.substr(pos, 4)), pos += 4;
        break;
      case 2: {
        const std::uint64_t n = varint();
        if (m.size() - pos < n) throw std::runtime_error("truncated bytes");
        f.bytes = std::string(m.substr(pos, n)), pos += n;
        break;
      }
      default:
        throw std::runtime_error("unexpected wire type " + std::to_string(f.wire_type));
    }
    fields.push_back(f);
  }
  return fields;
}

std::vector<Field> all(const std::vector<Field>& fields, int number) {
  std::vector<Field> out;
  for (const auto& f : fields)
    if (f.number == number) out.push_back(f);
  return out;
}

const Field& one(const std::vector<Field>& fields, int number, int wire_type) {
  const Field* found = nullptr;
  for (const auto& f : fields)
    if (f.number == number) {
      if (found) throw std::runtime_error("field " + std::to_string(number) + " appears twice");
      found = &f;
    }
  if (!found) throw std::runtime_error("no field " + std::to_string(number));
  if (found->wire_type != wire_type) throw std::runtime_error("field " + std::to_string(number) + ": wrong wire type");
  return *found;
}

bool has(const std::vector<Field>& fields, int number) {
  return !all(fields, number).empty();
}

double as_double(const Field& f) {
  return std::bit_cast<double>(f.value);
}
float as_float(const Field& f) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(f.value));
}

// ---- The tracker ----

loom::Registry& registry() {
  // Loaded once and never unloaded: exceptions made by the plugin's code must not outlive it.
  static loom::Registry r;
  static const bool loaded = [] {
    loom::PluginHost host;
    host.load({{LOOM_PLUGIN_FILE, "test"}}, r);
    for (const auto& p : host.plugins()) EXPECT_EQ(p.status, loom::PluginRecord::Status::loaded) << p.reason;
    return true;
  }();
  (void)loaded;
  return r;
}

loom::Handle<loom::Tracker> tensorboard() {
  return registry().create<loom::Tracker>({"tracker", "tensorboard", loom::Value("tensorboard"), "trainer.trackers"});
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class TensorBoardTracker : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom-tensorboard-test-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  loom::RunInfo run(std::int64_t start_step = 0) const {
    loom::Value config = loom::Value::map();
    config.set("seed", 1234);
    return {dir_.string(), "test-run", config, start_step};
  }

  // The event files, in the order TensorBoard reads them (by name).
  std::vector<fs::path> event_files() const {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir_ / "tensorboard")) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    return files;
  }

  fs::path dir_;
};

TEST_F(TensorBoardTracker, WritesFramedEventsWithScalarsAndText) {
  const double before = now();
  {
    auto t = tensorboard();
    t->start(run());
    t->log_scalars(1, {{"train/loss", 2.5}, {"train/lr", 1e-3}});
    t->log_scalars(2, {{"train/loss", 2.25}});
    t->log_text(2, "sample", "ROMEO:\nhello \xc3\xa9");
    t->flush();
  }
  const double after = now();

  const auto files = event_files();
  ASSERT_EQ(files.size(), 1u);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_TRUE(std::regex_match(files[0].filename().string(),
                               std::regex("events\\.out\\.tfevents\\.[0-9]{10}\\." + std::string(host))))
      << files[0];

  std::vector<std::string> records;
  ASSERT_NO_THROW(records = read_records(files[0]));
  ASSERT_EQ(records.size(), 6u);
  std::vector<std::vector<Field>> events;
  for (const auto& r : records) events.push_back(parse_message(r));
  for (const auto& e : events) {
    const double t = as_double(one(e, 1, 1));
    EXPECT_GE(t, before - 1.0);
    EXPECT_LE(t, after + 1.0);
  }

  // 0: the file version, first.
  EXPECT_EQ(one(events[0], 3, 2).bytes, "brain.Event:2");
  EXPECT_EQ(one(events[0], 2, 0).value, 0u);
  // 1: SessionLog START at the start step.
  EXPECT_EQ(one(parse_message(one(events[1], 7, 2).bytes), 1, 0).value, 1u);
  // 2: the resolved config, as text.
  {
    const auto value = parse_message(one(parse_message(one(events[2], 5, 2).bytes), 1, 2).bytes);
    EXPECT_EQ(one(value, 1, 2).bytes, "config");
    const auto tensor = parse_message(one(value, 8, 2).bytes);
    EXPECT_NE(one(tensor, 8, 2).bytes.find("seed: 1234"), std::string::npos);
  }
  // 3: two scalars at step 1, as float simple values.
  EXPECT_EQ(one(events[3], 2, 0).value, 1u);
  const auto values = all(parse_message(one(events[3], 5, 2).bytes), 1);
  ASSERT_EQ(values.size(), 2u);
  const auto loss = parse_message(values[0].bytes);
  EXPECT_EQ(one(loss, 1, 2).bytes, "train/loss");
  EXPECT_EQ(as_float(one(loss, 2, 5)), 2.5f);
  const auto lr = parse_message(values[1].bytes);
  EXPECT_EQ(one(lr, 1, 2).bytes, "train/lr");
  EXPECT_EQ(as_float(one(lr, 2, 5)), 1e-3f);
  // 4: step 2.
  EXPECT_EQ(one(events[4], 2, 0).value, 2u);
  // 5: the text sample, for the text plugin: a scalar DT_STRING tensor.
  EXPECT_EQ(one(events[5], 2, 0).value, 2u);
  const auto text = parse_message(one(parse_message(one(events[5], 5, 2).bytes), 1, 2).bytes);
  EXPECT_EQ(one(text, 1, 2).bytes, "sample");
  EXPECT_FALSE(has(text, 2));  // no simple_value
  const auto tensor = parse_message(one(text, 8, 2).bytes);
  EXPECT_EQ(one(tensor, 1, 0).value, 7u);        // DT_STRING
  EXPECT_TRUE(one(tensor, 2, 2).bytes.empty());  // shape: a scalar
  EXPECT_EQ(one(tensor, 8, 2).bytes, "ROMEO:\nhello \xc3\xa9");
  const auto plugin_data = parse_message(one(parse_message(one(text, 9, 2).bytes), 1, 2).bytes);
  EXPECT_EQ(one(plugin_data, 1, 2).bytes, "text");
}

TEST_F(TensorBoardTracker, AResumedRunWritesANewFileStartingAtItsStep) {
  {
    auto t = tensorboard();
    t->start(run());
    t->log_scalars(1, {{"train/loss", 1.0}});
  }
  {
    auto t = tensorboard();
    t->start(run(40));
    t->log_scalars(40, {{"train/loss", 0.5}});
    t->flush();
  }
  const auto files = event_files();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(read_records(files[0]).size(), 4u);  // the first part is left as it was
  const auto records = read_records(files[1]);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(one(parse_message(records[0]), 3, 2).bytes, "brain.Event:2");
  const auto start = parse_message(records[1]);
  EXPECT_EQ(one(start, 2, 0).value, 40u);
  EXPECT_EQ(one(parse_message(one(start, 7, 2).bytes), 1, 0).value, 1u);
}

TEST_F(TensorBoardTracker, ARunDirectoryThatCannotBeWrittenIsAUserError) {
  std::ofstream(dir_ / "file") << "not a directory";
  auto t = tensorboard();
  loom::RunInfo info = run();
  info.run_dir = (dir_ / "file").string();
  EXPECT_THROW(t->start(info), loom::UserError);
}

// ---- TensorBoard itself ----

// A Python that can import tensorboard, or "": the reference environment's
// (scripts/setup-python-env.sh installs TensorBoard there, pinned), then the system's.
std::string python_with_tensorboard() {
  for (const char* python : {LOOM_REFERENCE_ENV_PYTHON, "/usr/bin/python3", "python3"}) {
    const std::string probe = "'" + std::string(python) + "' -c 'import tensorboard' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return python;
  }
  return "";
}

std::string run_command(const std::string& command) {
  std::string out;
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return out;
  char buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  EXPECT_EQ(::pclose(pipe), 0) << command << "\n" << out;
  return out;
}

TEST_F(TensorBoardTracker, TensorBoardReadsTheScalarsAndTextBackAndHonoursAResume) {
  const std::string python = python_with_tensorboard();
  if (python.empty())
    return loom::test::skip_missing_reference(
        std::string("tensorboard is not available: no Python with the tensorboard package (") +
        LOOM_REFERENCE_ENV_PYTHON +
        ", /usr/bin/python3) to read the files back; scripts/setup-python-env.sh installs it");
  {
    auto t = tensorboard();
    t->start(run());
    for (int step = 0; step < 10; ++step)
      t->log_scalars(step, {{"train/loss", 10.0 - step}, {"train/lr", 0.001 * step}});
    t->log_text(5, "sample", "first part");
    t->flush();
  }
  {
    // Resumed from the checkpoint of step 5: what the first part logged from step 5 on is stale.
    auto t = tensorboard();
    t->start(run(5));
    for (int step = 5; step < 8; ++step) t->log_scalars(step, {{"train/loss", 100.0 + step}});
    t->log_text(6, "sample", "resumed \xc3\xa9");
    t->flush();
  }
  const std::string out = run_command("'" + python + "' " + LOOM_READ_EVENTS_SCRIPT + " " +
                                      (dir_ / "tensorboard").string() + " 2>/dev/null");
  nlohmann::json read;
  ASSERT_NO_THROW(read = nlohmann::json::parse(out)) << out;

  const auto& loss = read["scalars"]["train/loss"];
  ASSERT_EQ(loss.size(), 8u) << loss;
  for (int step = 0; step < 8; ++step) {
    EXPECT_EQ(loss[step][0].get<int>(), step);
    EXPECT_FLOAT_EQ(loss[step][1].get<float>(), step < 5 ? 10.0f - step : 100.0f + step);
  }
  const auto& lr = read["scalars"]["train/lr"];
  ASSERT_EQ(lr.size(), 5u) << lr;  // steps 5..9 purged by the resume, never logged again
  EXPECT_FLOAT_EQ(lr[4][1].get<float>(), 0.004f);

  const auto& sample = read["text"]["sample"];
  ASSERT_EQ(sample.size(), 1u) << sample;
  EXPECT_EQ(sample[0][0].get<int>(), 6);
  EXPECT_EQ(sample[0][1].get<std::string>(), "resumed \xc3\xa9");
  EXPECT_NE(read["text"]["config"][0][1].get<std::string>().find("seed: 1234"), std::string::npos) << read["text"];
}

}  // namespace
