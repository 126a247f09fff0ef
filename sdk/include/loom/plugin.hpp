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

#include "loom/component.hpp"
#include "loom/version.hpp"

extern "C" {

// Fixed-size, pointer-free, so the host can read it straight from the file.
struct LoomAbiRecord {
  char magic[8];  // "LOOMABI"
  std::uint32_t abi_major;
  std::uint32_t abi_minor;
  char sdk_version[32];
  char build_tag[192];  // "gcc-12.2;cxx11abi=1": see loom::check_abi
};

struct LoomRegisterResult {
  std::int32_t ok;  // 1 on success
  char message[1024];
};

typedef LoomRegisterResult (*LoomRegisterFunction)(loom::Registrar&) noexcept;
}

#define LOOM_DETAIL_STR2(x) #x
#define LOOM_DETAIL_STR(x) LOOM_DETAIL_STR2(x)

#if defined(__clang__)
#define LOOM_DETAIL_COMPILER "clang-" LOOM_DETAIL_STR(__clang_major__) "." LOOM_DETAIL_STR(__clang_minor__)
#elif defined(__GNUC__)
#define LOOM_DETAIL_COMPILER "gcc-" LOOM_DETAIL_STR(__GNUC__) "." LOOM_DETAIL_STR(__GNUC_MINOR__)
#else
#define LOOM_DETAIL_COMPILER "unknown"
#endif

// The build tag of the translation unit that expands it (the plugin's, or the core's): what the
// types crossing the plugin boundary depend on. No library a plugin may use privately (Eigen,
// for one) belongs here: its types never cross the boundary.
#define LOOM_BUILD_TAG LOOM_DETAIL_COMPILER ";cxx11abi=" LOOM_DETAIL_STR(_GLIBCXX_USE_CXX11_ABI)

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
    fail("register function threw an exception that is not a std::exception");
  }
  return result;
}

}  // namespace loom::detail

// Declares the plugin's two entry points. `register_function` is a function
// `void f(loom::Registrar&)` of the plugin; it may throw.
#define LOOM_PLUGIN(register_function)                                                                               \
  namespace loom_plugin_entry {                                                                                      \
  __attribute__((section("loom_abi"), used))                                                                         \
  const LoomAbiRecord abi_record = {"LOOMABI", LOOM_ABI_MAJOR, LOOM_ABI_MINOR, LOOM_VERSION_STRING, LOOM_BUILD_TAG}; \
  LoomRegisterResult register_entry(::loom::Registrar& registrar) noexcept {                                         \
    return ::loom::detail::run_registration(&register_function, registrar);                                          \
  }                                                                                                                  \
  }                                                                                                                  \
  BOOST_DLL_ALIAS(loom_plugin_entry::abi_record, loom_plugin_abi)                                                    \
  BOOST_DLL_ALIAS(loom_plugin_entry::register_entry, loom_plugin_register)
