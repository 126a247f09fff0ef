// Reading a plugin's ABI record from its file, before the dynamic loader runs any of its code.
#include <elf.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "loom/core/plugin_host.hpp"
#include "loom/error.hpp"
#include "loom/plugin.hpp"

namespace loom {

namespace {

template <class T>
T read_at(std::ifstream& in, std::uint64_t offset, std::uint64_t file_size, const char* what) {
  T value{};
  if (offset > file_size || sizeof(T) > file_size - offset)
    throw UserError(std::string("truncated ELF file (") + what + " lies past the end of the file)");
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(&value), sizeof(T));
  if (!in) throw UserError(std::string("cannot read ") + what);
  return value;
}

std::string fixed_string(const char* data, std::size_t size) {
  return std::string(data, strnlen(data, size));
}

}  // namespace

AbiRecordInfo read_abi_record(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UserError("cannot open the file");
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(file, ec);
  if (ec) throw UserError("cannot read the file's size: " + ec.message());

  unsigned char ident[EI_NIDENT] = {};
  in.read(reinterpret_cast<char*>(ident), EI_NIDENT);
  if (!in || std::memcmp(ident, ELFMAG, SELFMAG) != 0) throw UserError("not an ELF shared object");
  if (ident[EI_CLASS] != ELFCLASS64) throw UserError("not a 64-bit ELF object");
  if (ident[EI_DATA] != ELFDATA2LSB) throw UserError("not a little-endian ELF object");

  const auto header = read_at<Elf64_Ehdr>(in, 0, size, "the ELF header");
  if (header.e_type != ET_DYN) throw UserError("an ELF file, but not a shared object");
  if (header.e_machine != EM_X86_64 && header.e_machine != EM_AARCH64)
    throw UserError("a shared object for another processor (ELF machine " + std::to_string(header.e_machine) + ")");
  if (header.e_shentsize != sizeof(Elf64_Shdr) || header.e_shoff == 0)
    throw UserError("a shared object without section headers, so without a loom ABI record");

  std::uint64_t count = header.e_shnum;
  std::uint64_t names_index = header.e_shstrndx;
  const auto first = read_at<Elf64_Shdr>(in, header.e_shoff, size, "the section headers");
  if (count == 0) count = first.sh_size;  // extended numbering
  if (names_index == SHN_XINDEX) names_index = first.sh_link;
  if (names_index >= count) throw UserError("malformed ELF file (bad section name table index)");
  const auto names =
      read_at<Elf64_Shdr>(in, header.e_shoff + names_index * sizeof(Elf64_Shdr), size, "the section names");

  for (std::uint64_t i = 0; i < count; ++i) {
    const auto section = read_at<Elf64_Shdr>(in, header.e_shoff + i * sizeof(Elf64_Shdr), size, "a section header");
    char name[16] = {};
    if (section.sh_name >= names.sh_size) continue;
    const std::uint64_t name_offset = names.sh_offset + section.sh_name;
    if (name_offset >= size) continue;
    in.seekg(static_cast<std::streamoff>(name_offset));
    in.read(name, sizeof(name) - 1);
    in.clear();
    if (std::strcmp(name, "loom_abi") != 0) continue;

    // ABI 6 and older records end where `isa` begins.
    constexpr std::uint64_t short_size = offsetof(LoomAbiRecord, isa);
    if (section.sh_type == SHT_NOBITS || (section.sh_size != sizeof(LoomAbiRecord) && section.sh_size != short_size))
      throw UserError("malformed loom ABI record (section loom_abi has " + std::to_string(section.sh_size) +
                      " bytes, expected " + std::to_string(sizeof(LoomAbiRecord)) + ")");
    LoomAbiRecord record{};
    if (section.sh_size == sizeof(LoomAbiRecord)) {
      record = read_at<LoomAbiRecord>(in, section.sh_offset, size, "the loom ABI record");
    } else {
      struct ShortRecord {
        char bytes[short_size];
      };
      const auto bytes = read_at<ShortRecord>(in, section.sh_offset, size, "the loom ABI record");
      std::memcpy(&record, bytes.bytes, short_size);
    }
    if (std::memcmp(record.magic, "LOOMABI", 8) != 0) throw UserError("malformed loom ABI record (bad magic)");
    if (section.sh_size != sizeof(LoomAbiRecord) && record.abi_major >= 7)
      throw UserError("malformed loom ABI record (ABI " + std::to_string(record.abi_major) + " in " +
                      std::to_string(section.sh_size) + " bytes, expected " + std::to_string(sizeof(LoomAbiRecord)) +
                      ")");
    return AbiRecordInfo{
        record.abi_major, record.abi_minor, fixed_string(record.sdk_version, sizeof(record.sdk_version)),
        fixed_string(record.build_tag, sizeof(record.build_tag)), fixed_string(record.isa, sizeof(record.isa))};
  }
  throw UserError(
      "a shared object without a loom ABI record (missing symbol loom_plugin_abi: was it built with LOOM_PLUGIN?)");
}

std::string host_build_tag() {
  return LOOM_BUILD_TAG;
}

namespace {

// "gcc-12.2;cxxabi=itanium;stdlib=libstdc++-12;cxx11abi=1" -> {compiler: gcc-12.2, cxxabi:
// itanium, ...}. Fields the host does not check (older SDKs recorded eigen=...) are ignored.
std::vector<std::pair<std::string, std::string>> parse_tag(const std::string& tag) {
  std::vector<std::pair<std::string, std::string>> fields;
  std::size_t start = 0;
  while (start <= tag.size()) {
    std::size_t end = tag.find(';', start);
    if (end == std::string::npos) end = tag.size();
    std::string part = tag.substr(start, end - start);
    if (!part.empty()) {
      auto eq = part.find('=');
      if (eq == std::string::npos)
        fields.emplace_back("compiler", part);
      else
        fields.emplace_back(part.substr(0, eq), part.substr(eq + 1));
    }
    start = end + 1;
  }
  return fields;
}

std::string field(const std::vector<std::pair<std::string, std::string>>& fields, const std::string& key) {
  for (const auto& [k, v] : fields)
    if (k == key) return v;
  return "";
}

// "libstdc++-12" -> {"libstdc++", "12"}
std::pair<std::string, std::string> split_stdlib(const std::string& stdlib) {
  const auto dash = stdlib.rfind('-');
  if (dash == std::string::npos) return {stdlib, ""};
  return {stdlib.substr(0, dash), stdlib.substr(dash + 1)};
}

std::string abi_version(unsigned major, unsigned minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace

std::string check_abi(const AbiRecordInfo& record) {
  const std::string ours_abi = abi_version(abi_major, abi_minor);
  const std::string theirs_abi = abi_version(record.abi_major, record.abi_minor);
  const std::string rebuild =
      "; rebuild the plugin against the SDK installed with this loom (its loom/version.hpp says "
      "ABI " +
      ours_abi + ")";
  if (record.abi_major != abi_major)
    return "ABI mismatch: the plugin has ABI " + theirs_abi + " (SDK " + record.sdk_version + "), this loom has ABI " +
           ours_abi + " (SDK " + std::string(sdk_version) + ")" + rebuild;
  if (record.abi_minor > abi_minor)
    return "ABI mismatch: the plugin needs ABI " + theirs_abi + " (SDK " + record.sdk_version +
           "), newer than this loom's " + ours_abi +
           "; upgrade loom, or rebuild the plugin against the SDK installed "
           "with this loom";
  const auto theirs = parse_tag(record.build_tag);
  const auto ours = parse_tag(host_build_tag());
  const std::string compiler = field(theirs, "compiler");
  const std::string built_with = compiler.empty() ? "" : " (built with " + compiler + ")";

  if (field(theirs, "cxxabi") != field(ours, "cxxabi"))
    return "build mismatch: the plugin" + built_with + " follows the " +
           (field(theirs, "cxxabi").empty() ? std::string("unrecorded") : field(theirs, "cxxabi")) +
           " C++ ABI, this loom the " + field(ours, "cxxabi") +
           " one; build the plugin with a compiler of that C++ ABI (GCC or Clang)";

  const auto [their_lib, their_release] = split_stdlib(field(theirs, "stdlib"));
  const auto [our_lib, our_release] = split_stdlib(field(ours, "stdlib"));
  if (their_lib != our_lib)
    return "build mismatch: the plugin" + built_with + " is built against " +
           (their_lib.empty() ? std::string("an unrecorded standard library") : their_lib) + ", this loom against " +
           our_lib + ", and standard-library types cross the plugin boundary; build the plugin against " + our_lib +
           (their_lib == "libc++" ? " (without -stdlib=libc++)" : "");
  if (our_lib == "libstdc++") {
    const int theirs_n = std::atoi(their_release.c_str()), ours_n = std::atoi(our_release.c_str());
    if (theirs_n > ours_n)
      return "build mismatch: the plugin" + built_with + " is built against libstdc++ " + their_release +
             "'s headers, newer than this loom's libstdc++ " + our_release +
             ", whose library may lack what the plugin calls; build it with a compiler that uses libstdc++ " +
             our_release + " or older (g++-" + our_release + ", or clang++ --gcc-toolchain=<GCC " + our_release +
             "'s prefix>)";
    const std::string their_abi = field(theirs, "cxx11abi"), our_abi = field(ours, "cxx11abi");
    if (their_abi != our_abi)
      return "build mismatch: the plugin uses libstdc++ ABI cxx11abi=" + their_abi + ", this loom uses " + our_abi +
             " (std::string and std::list differ between the two); build the plugin with -D_GLIBCXX_USE_CXX11_ABI=" +
             our_abi + (our_abi == "1" ? " (or without defining it: 1 is the default)" : "");
  }
  if (std::string why = check_isa(record.isa, host_cpu_features()); !why.empty()) return why;
  return "";
}

}  // namespace loom
