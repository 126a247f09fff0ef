// The loom executable's first act: if this CPU lacks an instruction-set extension the build was
// compiled for (LOOM_ARCH, or LOOM_NATIVE on another machine), say so and exit with status 2,
// instead of dying of SIGILL somewhere in the start-up code.
//
// This file is compiled for the generic x86-64 target (apps/loom/CMakeLists.txt) and runs from
// .preinit_array, before the initialisers of any shared library (libloom_core.so, compiled for
// the baseline, included). It uses no standard library for that reason: an inline function of it
// could be replaced at link time by a copy compiled for the baseline. The executable says what it
// needs in `loom_executable_isa`, data written in a file compiled with the build's flags.
#include <unistd.h>

#include "loom/core/cpu_detect.hpp"

extern "C" const char loom_executable_isa[];

namespace {

namespace cd = loom::cpu_detect;

struct Buffer {
  char text[1024];
  int size = 0;
  void add(const char* s, int n = -1) {
    for (int i = 0; (n < 0 ? s[i] != '\0' : i < n) && size < static_cast<int>(sizeof(text)) - 1; ++i)
      text[size++] = s[i];
  }
};

bool has_level(const bool (&supported)[cd::feature_count], int level) {
  for (int i = 0; i < cd::feature_count; ++i)
    if (cd::features[i].level >= 2 && cd::features[i].level <= level && !supported[i]) return false;
  return true;
}

void check_cpu(int argc, char** argv, char**) {
#if defined(__x86_64__)
  const char* isa = loom_executable_isa;
  int end = 0;
  while (isa[end] != '\0' && isa[end] != '+') ++end;
  const int level = cd::level_of(isa, end);
  if (level == 0) return;
  bool supported[cd::feature_count];
  cd::detect(supported);
  Buffer missing;
  for (int i = 0; i < cd::feature_count; ++i)
    if (cd::features[i].level >= 2 && cd::features[i].level <= level && !supported[i]) {
      if (missing.size > 0) missing.add(", ");
      missing.add(cd::features[i].name);
    }
  for (int start = end; isa[start] == '+';) {
    int stop = start + 1;
    while (isa[stop] != '\0' && isa[stop] != '+') ++stop;
    const int i = cd::find_feature(isa + start + 1, stop - start - 1);
    if (i >= 0 && !supported[i]) {
      if (missing.size > 0) missing.add(", ");
      missing.add(cd::features[i].name);
    }
    start = stop;
  }
  if (missing.size == 0) return;
  int cpu_level = 1;
  while (cpu_level < 4 && has_level(supported, cpu_level + 1)) ++cpu_level;
  const char* levels[] = {"", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"};
  const char* program = argc > 0 && argv && argv[0] ? argv[0] : "loom";
  for (const char* p = program; *p; ++p)
    if (*p == '/') program = p + 1;
  Buffer message;
  message.add(program);
  message.add(": error: this CPU lacks ");
  message.add(missing.text, missing.size);
  message.add(", which this build needs (it is built for ");
  message.add(isa);
  message.add("; this CPU is ");
  message.add(levels[cpu_level]);
  message.add("); build loom for this CPU: cmake -DLOOM_ARCH=");
  message.add(levels[cpu_level]);
  message.add(", or -DLOOM_NATIVE=ON on this machine\n");
  const ssize_t written = ::write(2, message.text, static_cast<size_t>(message.size));
  (void)written;
  ::_exit(2);
#else
  (void)argc;
  (void)argv;
#endif
}

}  // namespace

__attribute__((section(".preinit_array"), used)) void (*const loom_preinit_check_cpu)(int, char**, char**) = check_cpu;
