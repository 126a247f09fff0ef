// The sentencepiece tokenizer against the `sentencepiece` Python package, token for token:
// sentencepiece_reference.py (run once, in the environment of scripts/setup-python-env.sh)
// trains a unigram and a BPE model with byte fallback on tinyshakespeare and generated text
// (emoji, CJK, combining marks, whitespace runs, digits) and writes its ids of varied texts;
// the plugin, loading the same files through Debian's libsentencepiece, must give the same ids
// and decode them to the same text. Skips, saying why, without the Python package.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/error.hpp>
#include <loom/hf_interop.hpp>
#include <loom/kinds/tokenizer.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "reference_required.hpp"

namespace {

namespace fs = std::filesystem;

class SentencePiece : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::error_code ec;
    if (!fs::exists(LOOM_REFERENCE_ENV_PYTHON, ec)) {
      skip_reason_ = "sentencepiece is not available: no Python environment at " +
                     std::string(LOOM_REFERENCE_ENV_PYTHON) + " (scripts/setup-python-env.sh makes it)";
      return;
    }
    dir_ = fs::temp_directory_path() / ("loom_sentencepiece_" + std::to_string(::getpid()));
    const fs::path log = dir_.string() + ".log";
    const std::string command = "'" LOOM_REFERENCE_ENV_PYTHON "' '" LOOM_SENTENCEPIECE_REFERENCE "' '" +
                                std::string(LOOM_TINYSHAKESPEARE) + "' '" + dir_.string() + "' > '" + log.string() +
                                "' 2>&1";
    const int rc = std::system(command.c_str());
    std::ifstream in(log);
    const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fs::remove(log, ec);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
      skip_reason_ = output.substr(0, output.find('\n'));
      return;
    }
    if (rc != 0) {
      failure_ = "sentencepiece_reference.py failed:\n" + output;
      return;
    }
    std::ifstream expected(dir_ / "expected.json");
    expected_ = nlohmann::json::parse(expected);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  void SetUp() override {
    if (!skip_reason_.empty()) return loom::test::skip_missing_reference(skip_reason_);
    ASSERT_TRUE(failure_.empty()) << failure_;
    loom::PluginHost().load({{LOOM_TOKENIZER_PLUGIN, "test"}}, registry_);
  }

  loom::Handle<loom::Tokenizer> make(const std::string& model_file) {
    loom::Value o = loom::Value::map();
    o.set("type", "sentencepiece");
    o.set("model_file", model_file);
    return registry_.create<loom::Tokenizer>(loom::ComponentRef{"tokenizer", "sentencepiece", o, "tokenizer"});
  }

  void check(const std::string& kind) {
    const auto tokenizer = make((dir_ / (kind + ".model")).string());
    EXPECT_EQ(tokenizer->vocab_size(), 800);
    const auto& texts = expected_["texts"];
    std::size_t tokens = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const auto want = expected_[kind][i].get<std::vector<std::int32_t>>();
      const auto got = tokenizer->encode(text);
      EXPECT_EQ(got, want) << kind << " text " << i << ": " << text;
      EXPECT_EQ(tokenizer->decode(got), expected_[kind + "_decoded"][i].get<std::string>()) << kind << " text " << i;
      tokens += got.size();
    }
    EXPECT_GT(tokens, 1000u);
    EXPECT_EQ(tokenizer->end_of_text(), std::optional<std::int32_t>(2));  // </s>, SentencePiece's default id
  }

  loom::Registry registry_;
  static inline fs::path dir_;
  static inline std::string skip_reason_, failure_;
  static inline nlohmann::json expected_;
};

TEST_F(SentencePiece, UnigramMatchesThePythonPackage) {
  check("unigram");
}

TEST_F(SentencePiece, BpeMatchesThePythonPackage) {
  check("bpe");
}

TEST_F(SentencePiece, BadFilesAndIdsAreUserErrors) {
  try {
    make((dir_ / "missing.model").string());
    FAIL() << "expected a UserError";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make((dir_ / "expected.json").string()), loom::UserError);  // not a model
  const auto tokenizer = make((dir_ / "unigram.model").string());
  const std::vector<std::int32_t> bad{5, 800};
  EXPECT_THROW(tokenizer->decode(bad), loom::UserError);
}

// `loom export`'s tokenizer files: the model as tokenizer.model, with the Hugging Face files
// beside it verbatim (a directory trainer.init_from read), or a tokenizer_config.json of its own.
TEST_F(SentencePiece, HuggingFaceFilesAreTheModelAndTheFilesBesideIt) {
  const fs::path dir = dir_ / "hf-files";
  fs::create_directories(dir);
  fs::copy_file(dir_ / "unigram.model", dir / "tokenizer.model", fs::copy_options::overwrite_existing);
  auto bytes = [](const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto files_of = [&] {
    const auto tokenizer = make((dir / "tokenizer.model").string());
    const auto* hf = dynamic_cast<const loom::HfTokenizer*>(tokenizer.get());
    EXPECT_NE(hf, nullptr) << "the sentencepiece tokenizer has a Hugging Face form";
    std::map<std::string, std::string> out;
    if (hf)
      for (const auto& f : hf->hf_tokenizer_files(512)) out[f.name] = f.content;
    return out;
  };
  auto alone = files_of();
  ASSERT_EQ(alone.size(), 2u);
  EXPECT_EQ(alone["tokenizer.model"], bytes(dir / "tokenizer.model"));
  const auto config = nlohmann::json::parse(alone["tokenizer_config.json"]);
  EXPECT_EQ(config["tokenizer_class"], "LlamaTokenizer");
  EXPECT_EQ(config["model_max_length"], 512);
  EXPECT_EQ(config["eos_token"], "</s>");

  const std::string own = R"({"tokenizer_class": "LlamaTokenizer", "model_max_length": 32768, "chat_template": "x"})";
  std::ofstream(dir / "tokenizer_config.json") << own;
  std::ofstream(dir / "special_tokens_map.json") << R"({"bos_token": "<s>"})";
  auto beside = files_of();
  ASSERT_EQ(beside.size(), 3u);
  EXPECT_EQ(beside["tokenizer_config.json"], own);
  EXPECT_EQ(beside["special_tokens_map.json"], R"({"bos_token": "<s>"})");
}

}  // namespace
