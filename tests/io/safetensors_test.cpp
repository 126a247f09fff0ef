// The safetensors reader and writer: byte layout, round trips, files written by other tools, and
// a clear UserError (naming the file and the tensor) for every way a file can be wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <loom/autograd.hpp>
#include <loom/safetensors.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../core/reference_required.hpp"

namespace {

namespace fs = std::filesystem;
namespace st = loom::safetensors;
using loom::DType;
using loom::Shape;
using loom::Tensor;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_safetensors_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path file(const std::string& name) const { return dir_ / name; }

  // Writes a file with `header` (JSON text, unpadded) and `data`, as another tool might.
  fs::path raw(const std::string& header, const std::string& data, const std::string& name = "raw.safetensors") {
    const fs::path p = file(name);
    std::ofstream out(p, std::ios::binary);
    const std::uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << data;
    return p;
  }

  static std::string bytes_of(const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }

  // The UserError message of opening `p`, or "" when it opens.
  static std::string open_error(const fs::path& p) {
    try {
      st::Reader r(p);
    } catch (const loom::UserError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

Tensor f32(std::vector<float> v, Shape s) {
  return Tensor::from(std::span<const float>(v), s);
}

TEST_F(SafetensorsTest, WritesTheDocumentedLayout) {
  const Tensor a = f32({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  const std::vector<std::int32_t> iv = {7, -8};
  const Tensor b = Tensor::from(std::span<const std::int32_t>(iv), Shape{2});
  Tensor h = Tensor::empty(Shape{3}, DType::bf16);
  for (int i = 0; i < 3; ++i) h.data<loom::bfloat16>()[i] = loom::to_bfloat16(0.5f * static_cast<float>(i));
  // bf16 given first: the writer still puts the 4-byte tensors first, for alignment.
  const std::vector<std::pair<std::string, Tensor>> tensors = {{"h", h}, {"a", a}, {"b", b}};
  st::save(file("x.safetensors"), tensors, {{"format", "pt"}, {"note", "hi"}});

  std::ifstream in(file("x.safetensors"), std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n = 0;
  std::memcpy(&n, all.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  const auto header = nlohmann::json::parse(all.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(header["b"]["dtype"], "I32");
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json::array({24, 32}));
  EXPECT_EQ(header["h"]["dtype"], "BF16");
  EXPECT_EQ(header["h"]["data_offsets"], nlohmann::json::array({32, 38}));
  EXPECT_EQ(all.size(), 8 + n + 38);
  float first;
  std::memcpy(&first, all.data() + 8 + n + 4, 4);
  EXPECT_EQ(first, 2.0f);
  EXPECT_TRUE(fs::exists(file("x.safetensors")));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1) << "temporary file left";
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeStridesAndMetadata) {
  const Tensor big = f32({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, Shape{3, 4});
  const Tensor column = big.slice(1, 1, 3);  // strided [3, 2]
  const Tensor empty = Tensor::empty(Shape{0, 5});
  const Tensor scalar = Tensor::scalar(2.5f);
  const std::vector<std::int32_t> iv = {1, 2, 3};
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"column", column},
      {"empty", empty},
      {"scalar", scalar},
      {"ids", Tensor::from(std::span<const std::int32_t>(iv), Shape{3, 1})}};
  st::save(file("r.safetensors"), tensors, {{"model", "{\"type\": \"gpt2\"}"}});
  const st::Reader r(file("r.safetensors"));
  EXPECT_EQ(r.metadata().at("model"), "{\"type\": \"gpt2\"}");
  EXPECT_EQ(r.tensors().size(), 4u);
  EXPECT_EQ(r.read("column").to_vector(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(r.read("column").shape(), (Shape{3, 2}));
  EXPECT_EQ(r.read("empty").shape(), (Shape{0, 5}));
  EXPECT_EQ(r.read("scalar").shape(), Shape{});
  EXPECT_EQ(r.read("scalar").item(), 2.5f);
  EXPECT_EQ(r.read("ids").dtype(), DType::i32);
  EXPECT_EQ(r.read("ids").to_int_vector(), iv);

  // Overwrite in place: the old file is replaced whole.
  const std::vector<std::pair<std::string, Tensor>> other = {{"only", scalar}};
  st::save(file("r.safetensors"), other);
  EXPECT_EQ(st::Reader(file("r.safetensors")).tensors().size(), 1u);
}

TEST_F(SafetensorsTest, ReadsFilesOtherToolsWrite) {
  // Unpadded header, entries in no particular order, metadata last, bf16 between f32s.
  const std::string data = bytes_of({1.5f, -2.0f}) + std::string("\x80\x3f\x00\x40", 4) + bytes_of({3.0f});
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"data_offsets":[12,16],"shape":[],)"
      R"("dtype":"F32"},"h":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},"__metadata__":{"a":"b"}})";
  const st::Reader r(raw(header, data));
  EXPECT_EQ(r.read("w").to_vector(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(r.read("h").dtype(), DType::bf16);
  EXPECT_EQ(r.read("h").to_vector(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(r.read("z").item(), 3.0f);
  // BF16 widens into an f32 destination; any destination strides.
  Tensor wide = Tensor::zeros(Shape{2, 4});
  Tensor dst = wide.slice(1, 1, 3).slice(0, 0, 1);  // [1, 2], strided
  r.read_into("h", dst);
  EXPECT_EQ(wide.to_vector(), (std::vector<float>{0, 1, 2, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r.metadata().at("a"), "b");
}

TEST_F(SafetensorsTest, RejectsBrokenFilesNamingFileAndTensor) {
  const std::string w = bytes_of({1, 2});
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape, int b, int e) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  struct Case {
    std::string what, header, data, expect;
  };
  const std::vector<Case> cases = {
      {"not json", "{\"w\": ", w, "not valid JSON"},
      {"not an object", "[1, 2]", "", "must be a JSON object"},
      {"unsupported dtype", "{" + entry("w", "F64", "[1]", 0, 8) + "}", w, "tensor 'w': dtype F64 is not supported"},
      {"unknown dtype", "{" + entry("w", "Q7", "[2]", 0, 8) + "}", w, "tensor 'w': unknown dtype 'Q7'"},
      {"size mismatch", "{" + entry("w", "F32", "[3]", 0, 8) + "}", w, "tensor 'w': holds 8 bytes but"},
      {"past the end", "{" + entry("w", "F32", "[4]", 0, 16) + "}", w, "tensor 'w': data_offsets [0, 16] run past"},
      {"backwards", "{" + entry("w", "F32", "[0]", 8, 0) + "}", w, "run backwards"},
      {"overlap", "{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[1]", 4, 8) + "}", w,
       "tensors 'a' and 'b' overlap"},
      {"gap", "{" + entry("a", "F32", "[1]", 4, 8) + "}", w, "bytes [0, 4) of the data belong to no tensor"},
      {"trailing", "{" + entry("a", "F32", "[1]", 0, 4) + "}", w, "last 4 bytes of the file belong to no tensor"},
      {"negative extent", "{" + entry("a", "F32", "[-2]", 0, 8) + "}", w, "non-negative integer"},
      {"unknown field", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", w, "unknown field 'x'"},
      {"missing field", R"({"a":{"dtype":"F32","shape":[2]}})", w, "needs dtype, shape and data_offsets"},
      {"bad metadata", R"({"__metadata__":{"k":3}})", "", "__metadata__['k'] must be a string"},
      {"overflowing shape", "{" + entry("a", "F32", "[4294967296,4294967296]", 0, 8) + "}", w, "more than 2^64"},
  };
  for (const auto& c : cases) {
    const std::string message = open_error(raw(c.header, c.data, "bad.safetensors"));
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.what << ": " << message;
    EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << c.what << ": " << message;
  }

  EXPECT_NE(open_error(file("absent.safetensors")).find("absent.safetensors': no such file"), std::string::npos);
  fs::create_directories(file("dir.safetensors"));
  EXPECT_NE(open_error(file("dir.safetensors")).find("is not a regular file"), std::string::npos);
  { std::ofstream(file("short.safetensors")) << "abc"; }
  EXPECT_NE(open_error(file("short.safetensors")).find("is truncated: 3 bytes"), std::string::npos);
  {
    std::ofstream out(file("long.safetensors"), std::ios::binary);
    const std::uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_NE(open_error(file("long.safetensors")).find("the header alone needs 1000 bytes"), std::string::npos);
  {
    std::ofstream out(file("huge.safetensors"), std::ios::binary);
    const std::uint64_t n = 1ull << 40;
    out.write(reinterpret_cast<const char*>(&n), 8);
  }
  EXPECT_NE(open_error(file("huge.safetensors")).find("exceeds the format's limit"), std::string::npos);

  // A valid file cut short.
  const std::vector<std::pair<std::string, Tensor>> t = {{"w", f32({1, 2, 3, 4}, Shape{4})}};
  st::save(file("cut.safetensors"), t);
  fs::resize_file(file("cut.safetensors"), fs::file_size(file("cut.safetensors")) - 3);
  EXPECT_NE(open_error(file("cut.safetensors")).find("tensor 'w'"), std::string::npos);
}

TEST_F(SafetensorsTest, ReaderReportsMissingAndMismatchedTensors) {
  const std::vector<std::pair<std::string, Tensor>> t = {{"weight", f32({1, 2, 3, 4}, Shape{2, 2})}};
  st::save(file("m.safetensors"), t);
  const st::Reader r(file("m.safetensors"));
  try {
    r.read("wieght");
    FAIL();
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'weight'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.read_into("weight", Tensor::zeros(Shape{4})), loom::UserError);
  EXPECT_THROW(r.read_into("weight", Tensor::zeros(Shape{2, 2}, DType::i32)), loom::UserError);
}

TEST_F(SafetensorsTest, SaveFailuresAreUserErrors) {
  const std::vector<std::pair<std::string, Tensor>> t = {{"w", Tensor::scalar(1)}};
  EXPECT_THROW(st::save(dir_ / "no" / "such" / "dir.safetensors", t), loom::UserError);
  const std::vector<std::pair<std::string, Tensor>> twice = {{"w", Tensor::scalar(1)}, {"w", Tensor::scalar(2)}};
  EXPECT_THROW(st::save(file("d.safetensors"), twice), loom::InternalError);
}

TEST_F(SafetensorsTest, ParametersLoadByNameOrNotAtAll) {
  loom::Parameter a("layer.weight", f32({1, 2, 3, 4, 5, 6}, Shape{2, 3}));
  loom::Parameter b("layer.bias", f32({7, 8}, Shape{2}));
  const std::vector<loom::ModelParameter> params = {{&a, loom::ParameterRole::weight}, {&b, loom::ParameterRole::bias}};
  st::save_parameters(file("p.safetensors"), params, {{"step", "10"}});

  loom::Parameter a2("layer.weight", Tensor::zeros(Shape{2, 3}));
  loom::Parameter b2("layer.bias", Tensor::zeros(Shape{2}));
  const std::vector<loom::ModelParameter> fresh = {{&a2, loom::ParameterRole::weight},
                                                   {&b2, loom::ParameterRole::bias}};
  EXPECT_EQ(st::load_parameters(file("p.safetensors"), fresh).at("step"), "10");
  EXPECT_EQ(a2.data().to_vector(), a.data().to_vector());
  EXPECT_EQ(b2.data().to_vector(), b.data().to_vector());

  // Missing, extra and mis-shaped names are all listed, and nothing is loaded.
  loom::Parameter wrong("layer.weight", Tensor::zeros(Shape{3, 2}));
  loom::Parameter other("head.weight", Tensor::zeros(Shape{2}));
  const std::vector<loom::ModelParameter> mismatched = {{&wrong, loom::ParameterRole::weight},
                                                        {&other, loom::ParameterRole::weight}};
  try {
    st::load_parameters(file("p.safetensors"), mismatched);
    FAIL();
  } catch (const loom::UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("missing from the file: head.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("in the file but not in the model: layer.bias"), std::string::npos) << m;
    EXPECT_NE(m.find("layer.weight (file: F32 [2, 3], model: F32 [3, 2])"), std::string::npos) << m;
  }
  for (float x : wrong.data().to_vector()) EXPECT_EQ(x, 0.0f);
}

TEST_F(SafetensorsTest, F16WidensToF32Exactly) {
  // binary16 bit patterns and the binary32 values they are: zeros, normals, the extremes,
  // subnormals (which become normal floats), infinities and NaNs.
  const std::vector<std::pair<std::uint16_t, float>> cases = {
      {0x0000, 0.0f},
      {0x8000, -0.0f},
      {0x3c00, 1.0f},
      {0xc000, -2.0f},
      {0x3555, 0.333251953125f},
      {0x7bff, 65504.0f},                  // the largest finite half
      {0x0400, std::ldexp(1.0f, -14)},     // the smallest normal
      {0x0001, std::ldexp(1.0f, -24)},     // the smallest subnormal
      {0x03ff, std::ldexp(1023.0f, -24)},  // the largest subnormal
      {0x8200, -std::ldexp(1.0f, -15)},    // a negative subnormal
      {0x7c00, INFINITY},
      {0xfc00, -INFINITY},
  };
  std::string data;
  for (const auto& [bits, value] : cases) data.append(reinterpret_cast<const char*>(&bits), 2);
  const std::uint16_t nans[] = {0x7e00, 0xfc01};  // a quiet NaN, a negative signalling one
  for (const auto bits : nans) data.append(reinterpret_cast<const char*>(&bits), 2);
  const std::size_t n = cases.size() + 2;
  const std::string header = R"({"h":{"dtype":"F16","shape":[)" + std::to_string(n) + R"(],"data_offsets":[0,)" +
                             std::to_string(2 * n) + "]}}";
  const st::Reader r(raw(header, data));
  EXPECT_EQ(r.info("h").stored_dtype, "F16");
  EXPECT_EQ(r.info("h").dtype, DType::f32);

  const Tensor read = r.read("h");
  ASSERT_EQ(read.dtype(), DType::f32);
  Tensor into = Tensor::zeros(Shape{static_cast<std::int64_t>(n)});
  r.read_into("h", into);
  for (const Tensor& t : {read, into}) {
    const std::vector<float> got = t.to_vector();
    for (std::size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(cases[i].second))
          << "half 0x" << std::hex << cases[i].first << " gave " << got[i];
    }
    EXPECT_TRUE(std::isnan(got[cases.size()]));
    EXPECT_FALSE(std::signbit(got[cases.size()]));
    EXPECT_TRUE(std::isnan(got[cases.size() + 1]));
    EXPECT_TRUE(std::signbit(got[cases.size() + 1]));
  }

  // A bf16 destination does not take F16 data: that would round.
  Tensor bf = Tensor::empty(Shape{static_cast<std::int64_t>(n)}, DType::bf16);
  try {
    r.read_into("h", bf);
    ADD_FAILURE() << "expected a UserError";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has dtype F16 but BF16 is expected"), std::string::npos) << e.what();
  }
}

// The header of `path`, parsed.
nlohmann::json header_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  return nlohmann::json::parse(text);
}

TEST_F(SafetensorsTest, MetadataSaysFormatPtBesideLoomsOwnKeys) {
  // Hugging Face's from_pretrained refuses a file whose metadata has no "format".
  const std::vector<std::pair<std::string, Tensor>> t = {{"w", f32({1, 2}, Shape{2})}};
  st::save(file("m.safetensors"), t, {{"model", "{\"type\": \"gpt2\"}"}, {"loom_version", "0.1.0"}});
  const auto meta = header_of(file("m.safetensors"))["__metadata__"];
  EXPECT_EQ(meta["format"], "pt");
  EXPECT_EQ(meta["model"], "{\"type\": \"gpt2\"}");
  EXPECT_EQ(meta["loom_version"], "0.1.0");
  EXPECT_EQ(meta.size(), 3u);

  st::save(file("bare.safetensors"), t);  // no metadata of loom's own: still a format
  EXPECT_EQ(header_of(file("bare.safetensors"))["__metadata__"]["format"], "pt");
  st::save(file("flax.safetensors"), t, {{"format", "flax"}});  // a caller that says otherwise
  EXPECT_EQ(header_of(file("flax.safetensors"))["__metadata__"]["format"], "flax");
}

// The first of the reference environment's Python (scripts/setup-python-env.sh) and Debian's
// that imports `modules`, or "" when neither does.
std::string python_with(const std::string& modules) {
  for (const std::string& python : {std::string(LOOM_REFERENCE_ENV_PYTHON), std::string("/usr/bin/python3")})
    if (fs::exists(python) && std::system((python + " -c 'import " + modules + "' >/dev/null 2>&1").c_str()) == 0)
      return python;
  return "";
}

TEST_F(SafetensorsTest, PythonSafetensorsAndTransformersOpenLoomsFileAsPyTorch) {
  const std::string python = python_with("safetensors, torch");
  if (python.empty())
    return loom::test::skip_missing_reference(std::string("neither ") + LOOM_REFERENCE_ENV_PYTHON +
                                              " (scripts/setup-python-env.sh) nor /usr/bin/python3 imports "
                                              "safetensors and torch");
  const std::vector<std::pair<std::string, Tensor>> t = {{"w", f32({1.5f, -2.0f, 3.0f}, Shape{3})}};
  st::save(file("py.safetensors"), t, {{"model", "gpt2"}});
  const fs::path script = file("check.py");
  // transformers' loader (what from_pretrained calls) refuses a file whose metadata has no
  // framework format; it is checked where transformers is installed.
  std::ofstream(script) << "import sys\n"
                           "from safetensors import safe_open\n"
                           "with safe_open(sys.argv[1], 'pt') as f:\n"
                           "    meta = f.metadata()\n"
                           "    assert meta == {'format': 'pt', 'model': 'gpt2'}, meta\n"
                           "    w = f.get_tensor('w')\n"
                           "    assert w.tolist() == [1.5, -2.0, 3.0], w\n"
                           "try:\n"
                           "    from transformers.modeling_utils import load_state_dict\n"
                           "except ImportError:\n"
                           "    print('transformers is not installed: its loader is not checked')\n"
                           "    sys.exit(0)\n"
                           "assert load_state_dict(sys.argv[1])['w'].tolist() == [1.5, -2.0, 3.0]\n";
  EXPECT_EQ(std::system((python + " " + script.string() + " " + file("py.safetensors").string()).c_str()), 0)
      << "with " << python;
}

}  // namespace
