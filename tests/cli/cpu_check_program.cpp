// A program with loom's start-up check (apps/loom/cpu_check.cpp) that claims to need extensions
// no known CPU has together: the check must stop it with a message before main runs.
#include <cstdio>

extern "C" const char loom_executable_isa[] = "x86-64-v4+avx512fp16+amx-tile+avx512vp2intersect";

int main() {
  std::puts("the start-up check let the program run");
  return 0;
}
