// `loom tokenize`, run as a user would, with the real `byte` and `char` tokenizer plugins (the
// tests skip when those are not built).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "dataset_test_support.hpp"
#include "loom/token_shard.hpp"

namespace loom::test {
namespace {

struct CommandResult {
  int status = -1;
  std::string output;  // stdout and stderr together
};

CommandResult loom(const std::string& args) {
  const std::string command = std::string(LOOM_BINARY) + " " + args + " 2>&1 </dev/null";
  CommandResult r;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return r;
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string quoted(const std::filesystem::path& p) {
  std::string q = "'";
  q += p.string();
  q += '\'';
  return q;
}

bool have_plugin(const std::string& name) {
  return std::filesystem::exists(std::filesystem::path(LOOM_PLUGIN_DIR) / ("libloom-" + name + ".so"));
}

const std::string plugins = std::string("--no-default-plugin-path --plugin-path '") + LOOM_PLUGIN_DIR + "'";

TEST(TokenizeCommand, WritesShardsFromTextAndJsonlWithProgressLines) {
  if (!have_plugin("tokenizer-byte")) GTEST_SKIP() << "the byte tokenizer plugin is not built";
  TempDir dir;
  const auto text = dir.write("a.txt", std::string(5000, 'x') + "end");
  const auto jsonl = dir.write("b.jsonl", "{\"text\": \"first\"}\n\n{\"text\": \"second\"}\n");
  const CommandResult r = loom("tokenize " + quoted(text) + " " + quoted(jsonl) + " -o " + quoted(dir.path() / "out") +
                               " --tokenizer byte --validation-fraction 0.1 " + plugins);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("loom tokenize: tokenizing 100%"), std::string::npos) << "plain lines when not a TTY\n"
                                                                                << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << "no bar redrawing when not a TTY";
  EXPECT_NE(r.output.find("wrote 1 training shard"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("type: tokens"), std::string::npos) << "it says how to use the shards\n" << r.output;
  const TokenShard train = TokenShard::open(dir.path() / "out" / "train-00000.bin");
  const TokenShard validation = TokenShard::open(dir.path() / "out" / "validation-00000.bin");
  EXPECT_EQ(train.info().vocab_size, 256);
  // Three documents, 5003 + 5 + 6 bytes, joined by two "\n" (byte has no end-of-text token).
  EXPECT_EQ(train.info().num_tokens + validation.info().num_tokens, 5003 + 5 + 6 + 2);
  EXPECT_EQ(train.info().num_tokens, static_cast<std::int64_t>(5016 * 0.9));
  EXPECT_EQ(validation.token(validation.info().num_tokens - 1), 'd');
}

TEST(TokenizeCommand, FromAConfigWithTheCharTokenizer) {
  if (!have_plugin("tokenizer-char") || !have_plugin("dataset-text")) GTEST_SKIP() << "plugins not built";
  TempDir dir;
  dir.write("corpus.txt", "to be or not to be, that is the question\n");
  const auto config = dir.write("run.yaml",
                                "tokenizer: char\n"
                                "data:\n"
                                "  type: text\n"
                                "  paths: [" +
                                    (dir.path() / "corpus.txt").string() + "]\n");
  const CommandResult r = loom("tokenize " + quoted(config) + " data.validation_fraction=0.25 -o " +
                               quoted(dir.path() / "shards") + " " + plugins);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "shards" / "tokenizer.state")) << r.output;
  const TokenShard train = TokenShard::open(dir.path() / "shards" / "train-00000.bin");
  EXPECT_EQ(train.info().num_tokens, 30);  // floor(41 characters * 0.75)
  EXPECT_EQ(train.info().vocab_size, 15) << "the distinct characters of the text";
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "shards" / "validation-00000.bin"));
  // The config names the tokenizer; the command line may not name another.
  const CommandResult twice =
      loom("tokenize " + quoted(config) + " -o " + quoted(dir.path() / "x") + " --tokenizer byte " + plugins);
  EXPECT_EQ(twice.status, 2);
  EXPECT_NE(twice.output.find("--tokenizer comes from the config"), std::string::npos) << twice.output;
}

TEST(TokenizeCommand, BadInvocationsExitWithStatus2) {
  if (!have_plugin("tokenizer-byte")) GTEST_SKIP() << "the byte tokenizer plugin is not built";
  TempDir dir;
  const auto text = dir.write("a.txt", "some text");
  CommandResult r = loom("tokenize " + quoted(dir.path() / "missing.txt") + " -o " + quoted(dir.path() / "o") +
                         " --tokenizer byte " + plugins);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("loom: error: no such file"), std::string::npos) << r.output;
  r = loom("tokenize " + quoted(text) + " --tokenizer byte " + plugins);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("-o DIR"), std::string::npos) << r.output;
  r = loom("tokenize " + quoted(text) + " -o " + quoted(dir.path() / "o") + " " + plugins);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--tokenizer NAME"), std::string::npos) << r.output;
  r = loom("tokenize " + quoted(text) + " -o " + quoted(dir.path() / "o") + " --tokenizer bite " + plugins);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("did you mean 'byte'"), std::string::npos) << r.output;
  ASSERT_EQ(
      loom("tokenize " + quoted(text) + " -o " + quoted(dir.path() / "o") + " --tokenizer byte " + plugins).status, 0);
  r = loom("tokenize " + quoted(text) + " -o " + quoted(dir.path() / "o") + " --tokenizer byte " + plugins);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--overwrite"), std::string::npos) << r.output;
  EXPECT_EQ(loom("tokenize --help").status, 0);
}

}  // namespace
}  // namespace loom::test
