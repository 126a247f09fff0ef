// LOOM_BUILD_ISA: the instruction set the translation unit that expands it is compiled for, read
// from the compiler's predefined macros (GCC and Clang): "x86-64-v3", or a level followed by the
// extensions beyond it ("x86-64-v4+avx512vnni+avx512bf16+..." for -march=native on an AVX-512
// CPU), "aarch64" or "unknown". LOOM_PLUGIN writes it into the plugin's ABI record, and the host
// refuses a plugin that needs an extension its CPU lacks instead of dying of SIGILL. The names are
// GCC's -m option names; loom::check_isa (core) knows how to test each on the running CPU.
#pragma once

#ifndef LOOM_DETAIL_STR
#define LOOM_DETAIL_STR2(x) #x
#define LOOM_DETAIL_STR(x) LOOM_DETAIL_STR2(x)
#endif

// clang-format off
#if defined(__x86_64__)
// The levels are cumulative: each adds its extensions to the one below.
#if defined(__SSE3__) \
    && defined(__SSSE3__) \
    && defined(__SSE4_1__) \
    && defined(__SSE4_2__) \
    && defined(__POPCNT__) \
    && defined(__GCC_HAVE_SYNC_COMPARE_AND_SWAP_16) \
    && defined(__LAHF_SAHF__)
#if defined(__AVX__) \
    && defined(__AVX2__) \
    && defined(__BMI__) \
    && defined(__BMI2__) \
    && defined(__F16C__) \
    && defined(__FMA__) \
    && defined(__LZCNT__) \
    && defined(__MOVBE__) \
    && defined(__XSAVE__)
#if defined(__AVX512F__) \
    && defined(__AVX512BW__) \
    && defined(__AVX512CD__) \
    && defined(__AVX512DQ__) \
    && defined(__AVX512VL__)
#define LOOM_DETAIL_ISA_LEVEL 4
#else
#define LOOM_DETAIL_ISA_LEVEL 3
#endif
#else
#define LOOM_DETAIL_ISA_LEVEL 2
#endif
#else
#define LOOM_DETAIL_ISA_LEVEL 1
#endif
#if defined(__SSE3__) && LOOM_DETAIL_ISA_LEVEL < 2
#define LOOM_DETAIL_ISA_SSE3 "+sse3"
#else
#define LOOM_DETAIL_ISA_SSE3 ""
#endif
#if defined(__SSSE3__) && LOOM_DETAIL_ISA_LEVEL < 2
#define LOOM_DETAIL_ISA_SSSE3 "+ssse3"
#else
#define LOOM_DETAIL_ISA_SSSE3 ""
#endif
#if defined(__SSE4_1__) && LOOM_DETAIL_ISA_LEVEL < 2
#define LOOM_DETAIL_ISA_SSE4_1 "+sse4.1"
#else
#define LOOM_DETAIL_ISA_SSE4_1 ""
#endif
#if defined(__SSE4_2__) && LOOM_DETAIL_ISA_LEVEL < 2
#define LOOM_DETAIL_ISA_SSE4_2 "+sse4.2"
#else
#define LOOM_DETAIL_ISA_SSE4_2 ""
#endif
#if defined(__POPCNT__) && LOOM_DETAIL_ISA_LEVEL < 2
#define LOOM_DETAIL_ISA_POPCNT "+popcnt"
#else
#define LOOM_DETAIL_ISA_POPCNT ""
#endif
#if defined(__GCC_HAVE_SYNC_COMPARE_AND_SWAP_16) && LOOM_DETAIL_ISA_LEVEL < 2
#define LOOM_DETAIL_ISA_CX16 "+cx16"
#else
#define LOOM_DETAIL_ISA_CX16 ""
#endif
#if defined(__LAHF_SAHF__) && LOOM_DETAIL_ISA_LEVEL < 2
#define LOOM_DETAIL_ISA_LAHF_SAHF "+lahf_sahf"
#else
#define LOOM_DETAIL_ISA_LAHF_SAHF ""
#endif
#if defined(__AVX__) && LOOM_DETAIL_ISA_LEVEL < 3
#define LOOM_DETAIL_ISA_AVX "+avx"
#else
#define LOOM_DETAIL_ISA_AVX ""
#endif
#if defined(__AVX2__) && LOOM_DETAIL_ISA_LEVEL < 3
#define LOOM_DETAIL_ISA_AVX2 "+avx2"
#else
#define LOOM_DETAIL_ISA_AVX2 ""
#endif
#if defined(__BMI__) && LOOM_DETAIL_ISA_LEVEL < 3
#define LOOM_DETAIL_ISA_BMI "+bmi"
#else
#define LOOM_DETAIL_ISA_BMI ""
#endif
#if defined(__BMI2__) && LOOM_DETAIL_ISA_LEVEL < 3
#define LOOM_DETAIL_ISA_BMI2 "+bmi2"
#else
#define LOOM_DETAIL_ISA_BMI2 ""
#endif
#if defined(__F16C__) && LOOM_DETAIL_ISA_LEVEL < 3
#define LOOM_DETAIL_ISA_F16C "+f16c"
#else
#define LOOM_DETAIL_ISA_F16C ""
#endif
#if defined(__FMA__) && LOOM_DETAIL_ISA_LEVEL < 3
#define LOOM_DETAIL_ISA_FMA "+fma"
#else
#define LOOM_DETAIL_ISA_FMA ""
#endif
#if defined(__LZCNT__) && LOOM_DETAIL_ISA_LEVEL < 3
#define LOOM_DETAIL_ISA_LZCNT "+lzcnt"
#else
#define LOOM_DETAIL_ISA_LZCNT ""
#endif
#if defined(__MOVBE__) && LOOM_DETAIL_ISA_LEVEL < 3
#define LOOM_DETAIL_ISA_MOVBE "+movbe"
#else
#define LOOM_DETAIL_ISA_MOVBE ""
#endif
#if defined(__XSAVE__) && LOOM_DETAIL_ISA_LEVEL < 3
#define LOOM_DETAIL_ISA_XSAVE "+xsave"
#else
#define LOOM_DETAIL_ISA_XSAVE ""
#endif
#if defined(__AVX512F__) && LOOM_DETAIL_ISA_LEVEL < 4
#define LOOM_DETAIL_ISA_AVX512F "+avx512f"
#else
#define LOOM_DETAIL_ISA_AVX512F ""
#endif
#if defined(__AVX512BW__) && LOOM_DETAIL_ISA_LEVEL < 4
#define LOOM_DETAIL_ISA_AVX512BW "+avx512bw"
#else
#define LOOM_DETAIL_ISA_AVX512BW ""
#endif
#if defined(__AVX512CD__) && LOOM_DETAIL_ISA_LEVEL < 4
#define LOOM_DETAIL_ISA_AVX512CD "+avx512cd"
#else
#define LOOM_DETAIL_ISA_AVX512CD ""
#endif
#if defined(__AVX512DQ__) && LOOM_DETAIL_ISA_LEVEL < 4
#define LOOM_DETAIL_ISA_AVX512DQ "+avx512dq"
#else
#define LOOM_DETAIL_ISA_AVX512DQ ""
#endif
#if defined(__AVX512VL__) && LOOM_DETAIL_ISA_LEVEL < 4
#define LOOM_DETAIL_ISA_AVX512VL "+avx512vl"
#else
#define LOOM_DETAIL_ISA_AVX512VL ""
#endif
#ifdef __AVX512VNNI__
#define LOOM_DETAIL_ISA_AVX512VNNI "+avx512vnni"
#else
#define LOOM_DETAIL_ISA_AVX512VNNI ""
#endif
#ifdef __AVX512BF16__
#define LOOM_DETAIL_ISA_AVX512BF16 "+avx512bf16"
#else
#define LOOM_DETAIL_ISA_AVX512BF16 ""
#endif
#ifdef __AVX512VBMI__
#define LOOM_DETAIL_ISA_AVX512VBMI "+avx512vbmi"
#else
#define LOOM_DETAIL_ISA_AVX512VBMI ""
#endif
#ifdef __AVX512VBMI2__
#define LOOM_DETAIL_ISA_AVX512VBMI2 "+avx512vbmi2"
#else
#define LOOM_DETAIL_ISA_AVX512VBMI2 ""
#endif
#ifdef __AVX512IFMA__
#define LOOM_DETAIL_ISA_AVX512IFMA "+avx512ifma"
#else
#define LOOM_DETAIL_ISA_AVX512IFMA ""
#endif
#ifdef __AVX512BITALG__
#define LOOM_DETAIL_ISA_AVX512BITALG "+avx512bitalg"
#else
#define LOOM_DETAIL_ISA_AVX512BITALG ""
#endif
#ifdef __AVX512VPOPCNTDQ__
#define LOOM_DETAIL_ISA_AVX512VPOPCNTDQ "+avx512vpopcntdq"
#else
#define LOOM_DETAIL_ISA_AVX512VPOPCNTDQ ""
#endif
#ifdef __AVX512FP16__
#define LOOM_DETAIL_ISA_AVX512FP16 "+avx512fp16"
#else
#define LOOM_DETAIL_ISA_AVX512FP16 ""
#endif
#ifdef __AVX512VP2INTERSECT__
#define LOOM_DETAIL_ISA_AVX512VP2INTERSECT "+avx512vp2intersect"
#else
#define LOOM_DETAIL_ISA_AVX512VP2INTERSECT ""
#endif
#ifdef __AVXVNNI__
#define LOOM_DETAIL_ISA_AVXVNNI "+avxvnni"
#else
#define LOOM_DETAIL_ISA_AVXVNNI ""
#endif
#ifdef __GFNI__
#define LOOM_DETAIL_ISA_GFNI "+gfni"
#else
#define LOOM_DETAIL_ISA_GFNI ""
#endif
#ifdef __VAES__
#define LOOM_DETAIL_ISA_VAES "+vaes"
#else
#define LOOM_DETAIL_ISA_VAES ""
#endif
#ifdef __VPCLMULQDQ__
#define LOOM_DETAIL_ISA_VPCLMULQDQ "+vpclmulqdq"
#else
#define LOOM_DETAIL_ISA_VPCLMULQDQ ""
#endif
#ifdef __SHA__
#define LOOM_DETAIL_ISA_SHA "+sha"
#else
#define LOOM_DETAIL_ISA_SHA ""
#endif
#ifdef __AES__
#define LOOM_DETAIL_ISA_AES "+aes"
#else
#define LOOM_DETAIL_ISA_AES ""
#endif
#ifdef __PCLMUL__
#define LOOM_DETAIL_ISA_PCLMUL "+pclmul"
#else
#define LOOM_DETAIL_ISA_PCLMUL ""
#endif
#ifdef __ADX__
#define LOOM_DETAIL_ISA_ADX "+adx"
#else
#define LOOM_DETAIL_ISA_ADX ""
#endif
#ifdef __RDRND__
#define LOOM_DETAIL_ISA_RDRND "+rdrnd"
#else
#define LOOM_DETAIL_ISA_RDRND ""
#endif
#ifdef __RDSEED__
#define LOOM_DETAIL_ISA_RDSEED "+rdseed"
#else
#define LOOM_DETAIL_ISA_RDSEED ""
#endif
#ifdef __SSE4A__
#define LOOM_DETAIL_ISA_SSE4A "+sse4a"
#else
#define LOOM_DETAIL_ISA_SSE4A ""
#endif
#ifdef __AMX_TILE__
#define LOOM_DETAIL_ISA_AMX_TILE "+amx-tile"
#else
#define LOOM_DETAIL_ISA_AMX_TILE ""
#endif
#ifdef __AMX_BF16__
#define LOOM_DETAIL_ISA_AMX_BF16 "+amx-bf16"
#else
#define LOOM_DETAIL_ISA_AMX_BF16 ""
#endif
#ifdef __AMX_INT8__
#define LOOM_DETAIL_ISA_AMX_INT8 "+amx-int8"
#else
#define LOOM_DETAIL_ISA_AMX_INT8 ""
#endif
#if LOOM_DETAIL_ISA_LEVEL == 1
#define LOOM_DETAIL_ISA_NAME "x86-64"
#else
#define LOOM_DETAIL_ISA_NAME "x86-64-v" LOOM_DETAIL_STR(LOOM_DETAIL_ISA_LEVEL)
#endif
#define LOOM_BUILD_ISA LOOM_DETAIL_ISA_NAME LOOM_DETAIL_ISA_SSE3 LOOM_DETAIL_ISA_SSSE3 LOOM_DETAIL_ISA_SSE4_1 LOOM_DETAIL_ISA_SSE4_2 LOOM_DETAIL_ISA_POPCNT LOOM_DETAIL_ISA_CX16 LOOM_DETAIL_ISA_LAHF_SAHF LOOM_DETAIL_ISA_AVX LOOM_DETAIL_ISA_AVX2 LOOM_DETAIL_ISA_BMI LOOM_DETAIL_ISA_BMI2 LOOM_DETAIL_ISA_F16C LOOM_DETAIL_ISA_FMA LOOM_DETAIL_ISA_LZCNT LOOM_DETAIL_ISA_MOVBE LOOM_DETAIL_ISA_XSAVE LOOM_DETAIL_ISA_AVX512F LOOM_DETAIL_ISA_AVX512BW LOOM_DETAIL_ISA_AVX512CD LOOM_DETAIL_ISA_AVX512DQ LOOM_DETAIL_ISA_AVX512VL LOOM_DETAIL_ISA_AVX512VNNI LOOM_DETAIL_ISA_AVX512BF16 LOOM_DETAIL_ISA_AVX512VBMI LOOM_DETAIL_ISA_AVX512VBMI2 LOOM_DETAIL_ISA_AVX512IFMA LOOM_DETAIL_ISA_AVX512BITALG LOOM_DETAIL_ISA_AVX512VPOPCNTDQ LOOM_DETAIL_ISA_AVX512FP16 LOOM_DETAIL_ISA_AVX512VP2INTERSECT LOOM_DETAIL_ISA_AVXVNNI LOOM_DETAIL_ISA_GFNI LOOM_DETAIL_ISA_VAES LOOM_DETAIL_ISA_VPCLMULQDQ LOOM_DETAIL_ISA_SHA LOOM_DETAIL_ISA_AES LOOM_DETAIL_ISA_PCLMUL LOOM_DETAIL_ISA_ADX LOOM_DETAIL_ISA_RDRND LOOM_DETAIL_ISA_RDSEED LOOM_DETAIL_ISA_SSE4A LOOM_DETAIL_ISA_AMX_TILE LOOM_DETAIL_ISA_AMX_BF16 LOOM_DETAIL_ISA_AMX_INT8
#elif defined(__aarch64__)
#define LOOM_BUILD_ISA "aarch64"
#else
#define LOOM_BUILD_ISA "unknown"
#endif
// clang-format on
