// The shard format (loom/token_shard.hpp): round trips, the header, and every way a file can be
// wrong.
#include "loom/token_shard.hpp"

#include <gtest/gtest.h>

#include <cstring>

#include "dataset_test_support.hpp"

namespace loom::test {
namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_all(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

template <class T>
T field(const std::string& bytes, std::size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

// Three documents: 0..9, 10..14, 15..39 (ids i * 97 % vocab).
std::filesystem::path write_shard(const std::filesystem::path& file, std::int64_t vocab, std::uint32_t bytes = 0,
                                  std::optional<std::int32_t> eot = std::nullopt) {
  TokenShardWriter w(file, vocab, eot, bytes);
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(static_cast<std::int32_t>((i * 97) % vocab));
  w.append(std::span(ids).first(10));
  w.end_document();
  w.append(std::span(ids).subspan(10, 5));
  w.end_document();
  w.end_document();  // an empty document is no document
  w.append(std::span(ids).subspan(15));
  w.finish();
  return file;
}

TEST(TokenShard, Crc32IsZlibs) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32(std::as_bytes(std::span(check.data(), check.size()))), 0xCBF43926u);
  // Continuing a checksum equals checksumming the concatenation.
  const std::string a = "hello, ", b = "world and a longer tail to cross eight bytes";
  const std::string ab = a + b;
  EXPECT_EQ(crc32(std::as_bytes(std::span(b.data(), b.size())), crc32(std::as_bytes(std::span(a.data(), a.size())))),
            crc32(std::as_bytes(std::span(ab.data(), ab.size()))));
  EXPECT_EQ(crc32({}), 0u);
}

TEST(TokenShard, RoundTripsBothWidths) {
  TempDir dir;
  for (const auto& [vocab, width] :
       std::vector<std::pair<std::int64_t, std::uint32_t>>{{300, 2}, {65536, 2}, {70000, 4}, {300, 4}}) {
    const auto file = write_shard(dir.path() / ("s" + std::to_string(vocab) + "-" + std::to_string(width) + ".bin"),
                                  vocab, width == 2 ? 0 : width, 7);
    EXPECT_EQ(token_bytes_for_vocab(vocab), vocab <= 65536 ? 2u : 4u);
    const TokenShard s = TokenShard::open(file);
    EXPECT_EQ(s.info().token_bytes, width);
    EXPECT_EQ(s.info().num_tokens, 40);
    EXPECT_EQ(s.info().num_documents, 3);
    EXPECT_EQ(s.info().vocab_size, vocab);
    EXPECT_EQ(s.info().end_of_text, 7);
    std::int64_t max_id = 0;
    for (int i = 0; i < 40; ++i) {
      EXPECT_EQ(s.token(i), (i * 97) % vocab);
      max_id = std::max<std::int64_t>(max_id, (i * 97) % vocab);
    }
    EXPECT_EQ(s.info().max_token_id, max_id);
    EXPECT_EQ(std::vector<std::int64_t>(s.document_ends().begin(), s.document_ends().end()),
              (std::vector<std::int64_t>{10, 15, 40}));
    EXPECT_FALSE(std::filesystem::exists(file.string() + ".partial"));
  }
}

// The header byte by byte, as docs/datasets.md describes it.
TEST(TokenShard, HeaderLayoutIsTheDocumentedOne) {
  TempDir dir;
  const auto file = write_shard(dir.path() / "a.bin", 1000, 0, 999);
  const std::string bytes = read_all(file);
  ASSERT_EQ(bytes.size(), 64u + 80u + 3u * 8u);  // header, 40 uint16 ids (80 bytes, already 8-aligned), index
  EXPECT_EQ(bytes.substr(0, 8), "LOOMTOKS");
  EXPECT_EQ(field<std::uint32_t>(bytes, 8), 1u);
  EXPECT_EQ(field<std::uint32_t>(bytes, 12), 2u);
  EXPECT_EQ(field<std::uint64_t>(bytes, 16), 40u);
  EXPECT_EQ(field<std::uint64_t>(bytes, 24), 3u);
  EXPECT_EQ(field<std::uint32_t>(bytes, 32), 1000u);
  EXPECT_EQ(field<std::int32_t>(bytes, 40), 999);
  const std::string body = bytes.substr(64);
  EXPECT_EQ(field<std::uint32_t>(bytes, 44), crc32(std::as_bytes(std::span(body.data(), body.size()))));
  for (std::size_t i = 48; i < 64; ++i) EXPECT_EQ(bytes[i], 0) << "reserved byte " << i;
  EXPECT_EQ(field<std::uint16_t>(bytes, 64 + 2 * 3), (3 * 97) % 1000);
  EXPECT_EQ(field<std::uint64_t>(bytes, 64 + 80 + 8), 15u);
  // An odd number of 2-byte ids is padded to 8 bytes before the index.
  TokenShardWriter w(dir.path() / "odd.bin", 10, std::nullopt);
  const std::vector<std::int32_t> three = {1, 2, 3};
  w.append(three);
  w.finish();
  const std::string odd = read_all(dir.path() / "odd.bin");
  EXPECT_EQ(odd.size(), 64u + 8u + 8u);
  EXPECT_EQ(field<std::int32_t>(odd, 40), -1) << "no end-of-text id";
  EXPECT_EQ(field<std::uint64_t>(odd, 72), 3u);
}

TEST(TokenShard, BadFilesAreUserErrorsNamingTheFile) {
  TempDir dir;
  const std::string good = read_all(write_shard(dir.path() / "good.bin", 1000));
  auto error_for = [&](const std::string& name, const std::string& bytes, bool verify = true) {
    const auto p = dir.path() / name;
    write_all(p, bytes);
    const std::string e = user_error([&] { TokenShard::open(p, verify); });
    EXPECT_NE(e.find(p.string()), std::string::npos) << e;
    return e;
  };
  auto patched = [&](std::size_t offset, const void* value, std::size_t n) {
    std::string b = good;
    std::memcpy(b.data() + offset, value, n);
    return b;
  };
  EXPECT_NE(user_error([&] { TokenShard::open(dir.path() / "absent.bin"); }).find("no such file"), std::string::npos);
  EXPECT_NE(error_for("empty.bin", "").find("not a loom token shard"), std::string::npos);
  EXPECT_NE(error_for("text.bin", "hello, this is text and not a shard at all, no, not at all, not one bit")
                .find("bad magic"),
            std::string::npos);
  EXPECT_NE(error_for("header.bin", good.substr(0, 40)).find("truncated"), std::string::npos);
  std::string e = error_for("truncated.bin", good.substr(0, good.size() - 5));
  EXPECT_NE(e.find("truncated: 163 bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("168 bytes in all"), std::string::npos) << e;
  e = error_for("long.bin", good + "extra");
  EXPECT_NE(e.find("corrupt: 173 bytes"), std::string::npos) << e;
  const std::uint32_t v2 = 2, width3 = 3, big_max = 5000;
  e = error_for("version.bin", patched(8, &v2, 4));
  EXPECT_NE(e.find("unsupported shard version 2"), std::string::npos) << e;
  e = error_for("width.bin", patched(12, &width3, 4));
  EXPECT_NE(e.find("token_bytes is 3"), std::string::npos) << e;
  e = error_for("max.bin", patched(36, &big_max, 4));
  EXPECT_NE(e.find("max_token_id 5000"), std::string::npos) << e;
  const std::uint16_t flipped = 1;
  e = error_for("crc.bin", patched(64 + 2, &flipped, 2));
  EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
  // Without verification the header is trusted, but the size is still checked.
  EXPECT_NO_THROW(TokenShard::open(dir.path() / "crc.bin", false));
  const std::uint64_t wrong_end = 39;
  e = error_for("index.bin", patched(64 + 80 + 16, &wrong_end, 8), false);
  EXPECT_NE(e.find("corrupt document index"), std::string::npos) << e;
}

TEST(TokenShard, WriterRejectsIdsOutsideTheVocabularyAndCleansUp) {
  TempDir dir;
  const auto file = dir.path() / "w.bin";
  {
    TokenShardWriter w(file, 100, std::nullopt);
    const std::vector<std::int32_t> ids = {1, 2, 100};
    const std::string e = user_error([&] { w.append(ids); });
    EXPECT_NE(e.find("token id 100 (token 2)"), std::string::npos) << e;
    EXPECT_TRUE(std::filesystem::exists(file.string() + ".partial"));
  }
  EXPECT_FALSE(std::filesystem::exists(file.string() + ".partial")) << "an unfinished writer removes its file";
  EXPECT_FALSE(std::filesystem::exists(file));
  EXPECT_NE(user_error([&] { TokenShardWriter(file, 70000, std::nullopt, 2); }).find("does not fit in 2-byte"),
            std::string::npos);
  EXPECT_NE(user_error([&] { TokenShardWriter(file, 100, 100); }).find("end-of-text id 100"), std::string::npos);
}

}  // namespace
}  // namespace loom::test
