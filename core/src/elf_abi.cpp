// Reading a plugin's ABI record from its file, before the dynamic loader runs any of its code.
#include <elf.h>

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

    if (section.sh_type == SHT_NOBITS || section.sh_size != sizeof(LoomAbiRecord))
      throw UserError("malformed loom ABI record (section loom_abi has " + std::to_string(section.sh_size) +
                      " bytes, expected " + std::to_string(sizeof(LoomAbiRecord)) + ")");
    const auto record = read_at<LoomAbiRecord>(in, section.sh_offset, size, "the loom ABI record");
    if (std::memcmp(record.magic, "LOOMABI", 8) != 0) throw UserError("malformed loom ABI record (bad magic)");
    return AbiRecordInfo{record.abi_major, record.abi_minor,
                         fixed_string(record.sdk_version, sizeof(record.sdk_version)),
                         fixed_string(record.build_tag, sizeof(record.build_tag))};
  }
  throw UserError(
      "a shared object without a loom ABI record (missing symbol loom_plugin_abi: was it built with LOOM_PLUGIN?)");
}

std::string host_build_tag() {
  return LOOM_BUILD_TAG;
}

namespace {

// "gcc-12.2;cxx11abi=1" -> {compiler: gcc-12.2, cxx11abi: 1}. Fields the host does not check
// (older SDKs recorded eigen=...) are ignored.
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

// "gcc-12.2" -> "gcc-12"
std::string compiler_major(const std::string& compiler) {
  return compiler.substr(0, compiler.find('.'));
}

}  // namespace

std::string check_abi(const AbiRecordInfo& record) {
  const std::string rebuild = "; rebuild the plugin against loom " + std::string(sdk_version) + "'s SDK";
  if (record.abi_major != abi_major)
    return "ABI mismatch: the plugin has ABI " + std::to_string(record.abi_major) + "." +
           std::to_string(record.abi_minor) + " (SDK " + record.sdk_version + "), this loom has ABI " +
           std::to_string(abi_major) + "." + std::to_string(abi_minor) + rebuild;
  if (record.abi_minor > abi_minor)
    return "ABI mismatch: the plugin needs ABI " + std::to_string(record.abi_major) + "." +
           std::to_string(record.abi_minor) + " (SDK " + record.sdk_version + "), newer than this loom's " +
           std::to_string(abi_major) + "." + std::to_string(abi_minor) + "; upgrade loom or rebuild the plugin";
  const auto theirs = parse_tag(record.build_tag);
  const auto ours = parse_tag(host_build_tag());
  if (compiler_major(field(theirs, "compiler")) != compiler_major(field(ours, "compiler")))
    return "build mismatch: the plugin was built with " + field(theirs, "compiler") + ", this loom with " +
           field(ours, "compiler") + rebuild;
  if (field(theirs, "cxx11abi") != field(ours, "cxx11abi"))
    return "build mismatch: the plugin uses libstdc++ ABI cxx11abi=" + field(theirs, "cxx11abi") + ", this loom " +
           field(ours, "cxx11abi") + rebuild;
  return "";
}

}  // namespace loom
