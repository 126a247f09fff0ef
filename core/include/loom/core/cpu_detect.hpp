// Which instruction-set extensions the running x86-64 CPU (and its operating system, for the
// register state of AVX, AVX-512 and AMX) supports, by the names of LOOM_BUILD_ISA
// (sdk/include/loom/build_isa.hpp).
//
// Deliberately free of the standard library and of external linkage: the loom executable's
// start-up check (apps/loom/cpu_check.cpp) includes it in a translation unit compiled for the
// generic x86-64 target, which runs before anything compiled for loom's baseline; an inline
// function shared with other translation units could be replaced, at link time, by their copy
// compiled for a newer instruction set.
#pragma once

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace loom::cpu_detect {

enum class Reg { l1_ecx, l7_ebx, l7_ecx, l7_edx, l7s1_eax, e1_ecx };
enum class OsState { none, avx, avx512, amx };

struct Feature {
  const char* name;
  int level;  // 2, 3 or 4: part of x86-64-v<level>; 0: an extension beyond the levels
  Reg reg;
  int bit;
  OsState os;
};

// clang-format off
inline constexpr Feature features[] = {
    {"sse3", 2, Reg::l1_ecx, 0, OsState::none},        {"ssse3", 2, Reg::l1_ecx, 9, OsState::none},
    {"sse4.1", 2, Reg::l1_ecx, 19, OsState::none},     {"sse4.2", 2, Reg::l1_ecx, 20, OsState::none},
    {"popcnt", 2, Reg::l1_ecx, 23, OsState::none},     {"cx16", 2, Reg::l1_ecx, 13, OsState::none},
    {"lahf_sahf", 2, Reg::e1_ecx, 0, OsState::none},
    {"avx", 3, Reg::l1_ecx, 28, OsState::avx},         {"avx2", 3, Reg::l7_ebx, 5, OsState::avx},
    {"bmi", 3, Reg::l7_ebx, 3, OsState::none},         {"bmi2", 3, Reg::l7_ebx, 8, OsState::none},
    {"f16c", 3, Reg::l1_ecx, 29, OsState::avx},        {"fma", 3, Reg::l1_ecx, 12, OsState::avx},
    {"lzcnt", 3, Reg::e1_ecx, 5, OsState::none},       {"movbe", 3, Reg::l1_ecx, 22, OsState::none},
    {"xsave", 3, Reg::l1_ecx, 26, OsState::none},
    {"avx512f", 4, Reg::l7_ebx, 16, OsState::avx512},  {"avx512bw", 4, Reg::l7_ebx, 30, OsState::avx512},
    {"avx512cd", 4, Reg::l7_ebx, 28, OsState::avx512}, {"avx512dq", 4, Reg::l7_ebx, 17, OsState::avx512},
    {"avx512vl", 4, Reg::l7_ebx, 31, OsState::avx512},
    {"avx512vnni", 0, Reg::l7_ecx, 11, OsState::avx512},       {"avx512bf16", 0, Reg::l7s1_eax, 5, OsState::avx512},
    {"avx512vbmi", 0, Reg::l7_ecx, 1, OsState::avx512},        {"avx512vbmi2", 0, Reg::l7_ecx, 6, OsState::avx512},
    {"avx512ifma", 0, Reg::l7_ebx, 21, OsState::avx512},       {"avx512bitalg", 0, Reg::l7_ecx, 12, OsState::avx512},
    {"avx512vpopcntdq", 0, Reg::l7_ecx, 14, OsState::avx512},  {"avx512fp16", 0, Reg::l7_edx, 23, OsState::avx512},
    {"avx512vp2intersect", 0, Reg::l7_edx, 8, OsState::avx512}, {"avxvnni", 0, Reg::l7s1_eax, 4, OsState::avx},
    {"gfni", 0, Reg::l7_ecx, 8, OsState::none},        {"vaes", 0, Reg::l7_ecx, 9, OsState::avx},
    {"vpclmulqdq", 0, Reg::l7_ecx, 10, OsState::avx},  {"sha", 0, Reg::l7_ebx, 29, OsState::none},
    {"aes", 0, Reg::l1_ecx, 25, OsState::none},        {"pclmul", 0, Reg::l1_ecx, 1, OsState::none},
    {"adx", 0, Reg::l7_ebx, 19, OsState::none},        {"rdrnd", 0, Reg::l1_ecx, 30, OsState::none},
    {"rdseed", 0, Reg::l7_ebx, 18, OsState::none},     {"sse4a", 0, Reg::e1_ecx, 6, OsState::none},
    {"amx-tile", 0, Reg::l7_edx, 24, OsState::amx},    {"amx-bf16", 0, Reg::l7_edx, 22, OsState::amx},
    {"amx-int8", 0, Reg::l7_edx, 25, OsState::amx},
};
// clang-format on
inline constexpr int feature_count = static_cast<int>(sizeof(features) / sizeof(features[0]));

// supported[i]: whether this CPU runs features[i]. All false off x86-64.
[[maybe_unused]] static void detect(bool (&supported)[feature_count]) {
  for (bool& s : supported) s = false;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  unsigned regs[6] = {};
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf >= 1) {
    __cpuid(1, a, b, c, d);
    regs[static_cast<int>(Reg::l1_ecx)] = c;
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    regs[static_cast<int>(Reg::l7_ebx)] = b;
    regs[static_cast<int>(Reg::l7_ecx)] = c;
    regs[static_cast<int>(Reg::l7_edx)] = d;
    if (a >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      regs[static_cast<int>(Reg::l7s1_eax)] = a;
    }
  }
  if (__get_cpuid_max(0x80000000u, nullptr) >= 0x80000001u) {
    __cpuid(0x80000001u, a, b, c, d);
    regs[static_cast<int>(Reg::e1_ecx)] = c;
  }
  // The register state the OS saves (XCR0): the CPU may have AVX-512 and the OS not enable it.
  unsigned long long xcr0 = 0;
  if (regs[static_cast<int>(Reg::l1_ecx)] & (1u << 27)) {  // OSXSAVE
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  const bool avx_state = (xcr0 & 0x6) == 0x6;
  const bool avx512_state = avx_state && (xcr0 & 0xe0) == 0xe0;
  const bool amx_state = (xcr0 & 0x60000) == 0x60000;
  for (int i = 0; i < feature_count; ++i) {
    const Feature& f = features[i];
    bool ok = (regs[static_cast<int>(f.reg)] >> f.bit) & 1u;
    if (f.os == OsState::avx) ok = ok && avx_state;
    if (f.os == OsState::avx512) ok = ok && avx512_state;
    if (f.os == OsState::amx) ok = ok && amx_state;
    supported[i] = ok;
  }
#endif
}

// Index of `name` (of length `length`, not necessarily terminated) in features, or -1.
[[maybe_unused]] static int find_feature(const char* name, int length) {
  for (int i = 0; i < feature_count; ++i) {
    const char* f = features[i].name;
    int k = 0;
    while (k < length && f[k] != '\0' && f[k] == name[k]) ++k;
    if (k == length && f[k] == '\0') return i;
  }
  return -1;
}

// The x86-64 level a name of LOOM_BUILD_ISA's first part stands for ("x86-64-v3" -> 3,
// "x86-64" -> 1), or 0 when it is no x86-64 level.
[[maybe_unused]] static int level_of(const char* name, int length) {
  const char base[] = "x86-64";
  for (int k = 0; k < 6; ++k)
    if (k >= length || name[k] != base[k]) return 0;
  if (length == 6) return 1;
  if (length == 9 && name[6] == '-' && name[7] == 'v' && name[8] >= '2' && name[8] <= '4') return name[8] - '0';
  return 0;
}

}  // namespace loom::cpu_detect
