// The plugin entry points.
//
// A plugin is a shared object named libloom-<kind>-<name>.so that exports exactly two C symbols,
// made by LOOM_PLUGIN:
//   loom_plugin_abi       the ABI record below, also placed in the ELF section `loom_abi` so the
//                         host checks it by reading the file, before any code of the plugin runs
//                         (static initialisers included);
//   loom_plugin_register  a noexcept function that receives the host's Registrar and returns a
//                         status and message. Exceptions thrown by the plugin's own register
//                         function are caught here and returned as a failed status.
//
//   static void register_components(loom::Registrar& r) {
//     r.add<loom::LrSchedule>({...}, [](const loom::Options& o, const loom::CreateContext&) {
//       return std::make_unique<MySchedule>(o);
//     });
//   }
//   LOOM_PLUGIN(register_components)
#pragma once

// Boost.DLL on std::filesystem, so that a plugin pulls in (and exports) nothing of Boost.System.
#ifndef BOOST_DLL_USE_STD_FS
#define BOOST_DLL_USE_STD_FS
#endif
#include <boost/dll/alias.hpp>
#include <cstdint>
#include <cstring>
#include <exception>

#include "loom/build_isa.hpp"
#include "loom/component.hpp"
#include "loom/error.hpp"
#include "loom/version.hpp"

extern "C" {

// Fixed-size, pointer-free, so the host can read it straight from the file. ABI 6 and older
// records end before `isa`; the host still reads them, to refuse them by their ABI version.
struct LoomAbiRecord {
  char magic[8];  // "LOOMABI"
  std::uint32_t abi_major;
  std::uint32_t abi_minor;
  char sdk_version[32];
  char build_tag[192];  // "gcc-12.2;cxxabi=itanium;stdlib=libstdc++-12;cxx11abi=1": see loom::check_abi
  char isa[256];        // LOOM_BUILD_ISA: "x86-64-v3", "x86-64-v4+avx512bf16+...": see loom::check_isa
};

struct LoomRegisterResult {
  std::int32_t ok;  // 1 on success
  char message[1024];
};

typedef LoomRegisterResult (*LoomRegisterFunction)(loom::Registrar&) noexcept;
}

#if defined(__clang__)
#define LOOM_DETAIL_COMPILER "clang-" LOOM_DETAIL_STR(__clang_major__) "." LOOM_DETAIL_STR(__clang_minor__)
#elif defined(__GNUC__)
#define LOOM_DETAIL_COMPILER "gcc-" LOOM_DETAIL_STR(__GNUC__) "." LOOM_DETAIL_STR(__GNUC_MINOR__)
#else
#define LOOM_DETAIL_COMPILER "unknown"
#endif

// The C++ ABI: GCC and Clang both follow the Itanium C++ ABI on Linux (and say so with
// __GXX_ABI_VERSION, whose value differs between them without an incompatibility).
#if defined(__GXX_ABI_VERSION)
#define LOOM_DETAIL_CXXABI "itanium"
#else
#define LOOM_DETAIL_CXXABI "unknown"
#endif

// The standard library, whose types (std::string, std::vector, std::function, std::shared_ptr)
// cross the plugin boundary: libstdc++ with its release and dual ABI, or libc++.
#if defined(_LIBCPP_VERSION)
#define LOOM_DETAIL_STDLIB "stdlib=libc++-" LOOM_DETAIL_STR(_LIBCPP_VERSION)
#elif defined(_GLIBCXX_RELEASE)
#define LOOM_DETAIL_STDLIB \
  "stdlib=libstdc++-" LOOM_DETAIL_STR(_GLIBCXX_RELEASE) ";cxx11abi=" LOOM_DETAIL_STR(_GLIBCXX_USE_CXX11_ABI)
#else
#define LOOM_DETAIL_STDLIB "stdlib=unknown"
#endif

// The build tag of the translation unit that expands it (the plugin's, or the core's): what the
// types crossing the plugin boundary depend on. The compiler is recorded for `loom plugins`, not
// checked: a Clang-built plugin works with a GCC-built loom when the fields after it agree. No
// library a plugin may use privately (Eigen, for one) belongs here: its types never cross the
// boundary.
#define LOOM_BUILD_TAG LOOM_DETAIL_COMPILER ";cxxabi=" LOOM_DETAIL_CXXABI ";" LOOM_DETAIL_STDLIB

namespace loom::detail {

inline LoomRegisterResult run_registration(void (*fn)(Registrar&), Registrar& registrar) noexcept {
  LoomRegisterResult result{};
  auto fail = [&result](const char* what) {
    result.ok = 0;
    std::strncpy(result.message, what, sizeof(result.message) - 1);
  };
  try {
    fn(registrar);
    result.ok = 1;
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail(("threw " + describe_current_exception()).c_str());
  }
  return result;
}

}  // namespace loom::detail

// Declares the plugin's two entry points. `register_function` is a function
// `void f(loom::Registrar&)` of the plugin; it may throw.
#define LOOM_PLUGIN(register_function)                                                                 \
  namespace loom_plugin_entry {                                                                        \
  __attribute__((section("loom_abi"), used)) const LoomAbiRecord abi_record = {                        \
      "LOOMABI", LOOM_ABI_MAJOR, LOOM_ABI_MINOR, LOOM_VERSION_STRING, LOOM_BUILD_TAG, LOOM_BUILD_ISA}; \
  LoomRegisterResult register_entry(::loom::Registrar& registrar) noexcept {                           \
    return ::loom::detail::run_registration(&register_function, registrar);                            \
  }                                                                                                    \
  }                                                                                                    \
  BOOST_DLL_ALIAS(loom_plugin_entry::abi_record, loom_plugin_abi)                                      \
  BOOST_DLL_ALIAS(loom_plugin_entry::register_entry, loom_plugin_register)
