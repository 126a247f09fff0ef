// The plugin host: discovery order, de-duplication, shadowing, duplicate names, every way a
// plugin can fail, and handles that keep their library loaded.
#include "loom/core/plugin_host.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/hf_architecture.hpp"
#include "loom/kinds/lr_schedule.hpp"
#include "loom/kinds/tokenizer.hpp"
#include "loom/plugin.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace loom {
namespace {

using test::fixture_dir;

const PluginRecord* record_for(const PluginHost& host, const std::string& file_name) {
  for (const auto& p : host.plugins())
    if (fs::path(p.file).filename() == file_name) return &p;
  return nullptr;
}

TEST(PluginHost, LoadsAGoodPluginAndCreatesItsComponents) {
  Registry registry;
  PluginHost host;
  host.load({{fixture_dir("good"), "test"}}, registry);
  const PluginRecord* r = record_for(host, "libloom-test-good.so");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status, PluginRecord::Status::loaded) << r->reason;
  EXPECT_EQ(r->components, (std::vector<std::string>{"lr_schedule/test_scaled", "tokenizer/test_bytes"}));
  EXPECT_EQ(r->sdk_version, sdk_version);
  EXPECT_EQ(r->build_tag, host_build_tag());

  const ComponentEntry* e = registry.find("lr_schedule", "test_scaled");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->decl.version, "0.0.1");
  EXPECT_EQ(e->plugin_file, fs::canonical(fixture_dir("good") / "libloom-test-good.so").string());

  Value node = Value::map();
  node.set("type", "test_scaled");
  node.set("scale", 0.25);
  node.set("hold_steps", 2);
  auto schedule = registry.create<LrSchedule>({"lr_schedule", "", node, "lr_schedule"});
  EXPECT_DOUBLE_EQ(schedule->learning_rate(1, 10, 4.0), 4.0);
  EXPECT_DOUBLE_EQ(schedule->learning_rate(2, 10, 4.0), 1.0);
}

TEST(PluginHost, HandlesKeepTheLibraryLoadedAfterTheRegistryIsGone) {
  Handle<Tokenizer> tokenizer;
  {
    Registry registry;
    PluginHost host;
    host.load({{fixture_dir("good"), "test"}}, registry);
    tokenizer = registry.create<Tokenizer>({"tokenizer", "test_bytes", Value(), "tokenizer"});
  }
  // The registry and host are destroyed; the handle's code and vtable must still be there.
  EXPECT_EQ(tokenizer->vocab_size(), 256);
  EXPECT_EQ(tokenizer->encode("hi"), (std::vector<std::int32_t>{104, 105}));
}

TEST(PluginHost, EachBrokenPluginIsRecordedWithItsReason) {
  Registry registry;
  PluginHost host;
  ASSERT_NO_THROW(host.load({{fixture_dir("broken"), "test"}}, registry));
  struct Expected {
    const char* file;
    const char* reason;
  };
  const Expected expected[] = {
      {"libloom-test-text.so", "not an ELF shared object"},
      {"libloom-test-no-abi.so", "without a loom ABI record (missing symbol loom_plugin_abi"},
      {"libloom-test-no-register.so", "missing symbol loom_plugin_register"},
      {"libloom-test-abi-major.so", "ABI mismatch: the plugin has ABI 999."},  // minor: this SDK's
      // An ABI 6 record, shorter than this ABI's: refused for its version, not as malformed.
      {"libloom-test-abi-6.so", "ABI mismatch: the plugin has ABI 6.0"},
      // Recorded as built with gcc-3.4: refused for its string ABI only, saying what to change.
      {"libloom-test-build-tag.so",
       "build mismatch: the plugin uses libstdc++ ABI cxx11abi=0, this loom uses 1 (std::string and std::list "
       "differ between the two); build the plugin with -D_GLIBCXX_USE_CXX11_ABI=1"},
      {"libloom-test-fails.so", "register function failed: the test plugin reports an error"},
      {"libloom-test-throws.so", "register function failed: the test plugin refuses to register"},
      {"libloom-test-throws-non-std.so",
       "register function failed: threw an exception that is not a std::exception (of type int)"},
      {"libloom-test-undefined.so", "undefined symbol: loom_test_symbol_that_does_not_exist"},
      {"libloom-test-undefined-cxx.so",
       "undefined symbol: loom_test::function_that_does_not_exist(char const*, double)"},
  };
  for (const auto& x : expected) {
    const PluginRecord* r = record_for(host, x.file);
    ASSERT_NE(r, nullptr) << x.file;
    EXPECT_EQ(r->status, PluginRecord::Status::failed) << x.file;
    EXPECT_NE(r->reason.find(x.reason), std::string::npos) << x.file << ": " << r->reason;
    EXPECT_TRUE(r->components.empty()) << x.file;
  }
  EXPECT_EQ(host.plugins().size(), std::size(expected));
  // The plugin that threw after registering one component contributes nothing.
  EXPECT_EQ(registry.find("lr_schedule", "test_half_registered"), nullptr);
  EXPECT_EQ(registry.failed_plugins().size(), std::size(expected));
}

// A default outside its own option's range or choices fails the plugin at load, naming the
// component and the option, so that `loom plugins`, `loom config schema` and `loom conformance`
// see it and not only a run.
TEST(PluginHost, ADefaultItsOwnOptionRefusesFailsThePlugin) {
  Registry registry;
  PluginHost host;
  host.load({{fixture_dir("bad_default"), "test"}}, registry);
  const PluginRecord* range = record_for(host, "libloom-test-bad-range.so");
  ASSERT_NE(range, nullptr);
  EXPECT_EQ(range->status, PluginRecord::Status::failed);
  EXPECT_NE(range->reason.find("lr_schedule 'test_bad_default' declares the option 'beta' with the default 1.5, "
                               "which the option itself refuses (expected a number in [0, 1), got 1.5"),
            std::string::npos)
      << range->reason;
  EXPECT_TRUE(range->components.empty());
  const PluginRecord* choice = record_for(host, "libloom-test-bad-choice.so");
  ASSERT_NE(choice, nullptr);
  EXPECT_EQ(choice->status, PluginRecord::Status::failed);
  EXPECT_NE(choice->reason.find("'mode' with the default \"constant\""), std::string::npos) << choice->reason;
  // Neither plugin contributes its valid component either.
  EXPECT_EQ(registry.find("lr_schedule", "test_valid_defaults"), nullptr);
  EXPECT_EQ(registry.failed_plugins().size(), 2u);
}

TEST(PluginHost, AnExceptionThatIsNotAStdExceptionNamesTheComponent) {
  Registry registry;
  PluginHost host;
  host.load({{fixture_dir("nonstd"), "test"}}, registry);
  try {
    registry.create<LrSchedule>({"lr_schedule", "test_throws_int", Value(), "lr_schedule"});
    FAIL() << "expected an error";
  } catch (const InternalError& e) {
    EXPECT_EQ(std::string(e.what()),
              "while creating lr_schedule 'test_throws_int' (lr_schedule): an exception that is not a std::exception "
              "(of type int)");
  }
}

TEST(PluginHost, LoadsAPluginBuiltWithClang) {
  // The good plugin built with clang++ (tests/CMakeLists.txt) against this loom, built with
  // whichever compiler: both follow the Itanium C++ ABI and use libstdc++.
  const std::string plugin = LOOM_CLANG_FIXTURE;
  if (plugin.empty()) GTEST_SKIP() << "clang++ was not found when the tests were configured (install clang)";
  Registry registry;
  PluginHost host;
  host.load({{plugin, "test"}}, registry);
  ASSERT_EQ(host.plugins().size(), 1u);
  const PluginRecord& r = host.plugins()[0];
  EXPECT_EQ(r.status, PluginRecord::Status::loaded) << r.reason;
  EXPECT_EQ(r.build_tag.rfind("clang-", 0), 0u) << r.build_tag;
  // Objects made by it cross the boundary both ways: options in, std::vector and std::string out.
  Value node = Value::map();
  node.set("type", "test_scaled");
  node.set("scale", 0.25);
  node.set("hold_steps", 2);
  auto schedule = registry.create<LrSchedule>({"lr_schedule", "", node, "lr_schedule"});
  EXPECT_DOUBLE_EQ(schedule->learning_rate(2, 10, 4.0), 1.0);
  auto tokenizer = registry.create<Tokenizer>({"tokenizer", "test_bytes", Value(), "tokenizer"});
  EXPECT_EQ(tokenizer->encode("hi"), (std::vector<std::int32_t>{104, 105}));
}

TEST(PluginHost, RefusesAPluginNeedingInstructionsThisCpuLacks) {
  const std::vector<std::string> cpu = host_cpu_features();
  const std::vector<std::string> claimed = {"avx512fp16", "amx-tile", "avx512vp2intersect"};
  std::vector<std::string> lacking;
  for (const auto& f : claimed)
    if (std::find(cpu.begin(), cpu.end(), f) == cpu.end()) lacking.push_back(f);
  if (lacking.empty()) GTEST_SKIP() << "this CPU has every extension the fixture claims";
  Registry registry;
  PluginHost host;
  host.load({{fixture_dir("isa"), "test"}}, registry);
  ASSERT_EQ(host.plugins().size(), 1u);
  const PluginRecord& r = host.plugins()[0];
  EXPECT_EQ(r.status, PluginRecord::Status::failed);
  EXPECT_EQ(r.isa, "x86-64-v4+avx512fp16+amx-tile+avx512vp2intersect");
  EXPECT_NE(r.reason.find("instruction set: the plugin needs " + lacking[0]), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("which this CPU (" + describe_cpu(cpu) + ") lacks"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("rebuild it without -march=native"), std::string::npos) << r.reason;
  // Listed among the failures a run's "unknown type" error repeats.
  ASSERT_EQ(registry.failed_plugins().size(), 1u);
}

TEST(PluginHost, TwoPluginsClaimingOneNameIsAnErrorNamingBothFiles) {
  Registry registry;
  PluginHost host;
  host.load({{fixture_dir("dup"), "test"}}, registry);
  const std::string a = fs::canonical(fixture_dir("dup") / "libloom-test-dup-a.so").string();
  const std::string b = fs::canonical(fixture_dir("dup") / "libloom-test-dup-b.so").string();
  const PluginRecord* rb = record_for(host, "libloom-test-dup-b.so");
  ASSERT_NE(rb, nullptr);
  EXPECT_EQ(rb->status, PluginRecord::Status::failed);
  EXPECT_NE(rb->reason.find("lr_schedule/test_dup is already provided by " + a + "; " + b + " claims it too"),
            std::string::npos)
      << rb->reason;
  // Unrelated plugins in the same directory are unaffected.
  EXPECT_NE(registry.find("lr_schedule", "test_other"), nullptr);
  // Asking for the contested name is an error naming both files.
  try {
    registry.create<LrSchedule>({"lr_schedule", "test_dup", Value(), "lr_schedule"});
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'test_dup' is provided by two plugins, " + a + " and " + b),
              std::string::npos)
        << e.what();
  }
}

// A model plugin's claim of Hugging Face model_types (Registrar::add_hf_architectures) is
// registered with its file and its mapping; a second plugin claiming one of them fails as a whole
// (its model is not registered either), naming both files; a plugin of ABI minor 0, built before
// claims existed, loads and registers its model without one.
TEST(PluginHost, AModelPluginsHuggingFaceClaimIsRegisteredWithItsFile) {
  Registry registry;
  PluginHost host;
  host.load({{fixture_dir("hf"), "test"}}, registry);
  const std::string a = fs::canonical(fixture_dir("hf") / "libloom-test-hf-a.so").string();
  const std::string b = fs::canonical(fixture_dir("hf") / "libloom-test-hf-b.so").string();
  const HfArchitectureEntry* claim = registry.find_hf_architecture("test_arch");
  ASSERT_NE(claim, nullptr);
  EXPECT_EQ(claim->decl.model, "test_hf_a");
  EXPECT_EQ(claim->plugin_file, a);
  EXPECT_EQ(claim->decl.model_types, std::vector<std::string>{"test_arch"});
  Value config = Value::map();
  config.set("width", 5);
  const HfModelSection section = claim->decl.model_section(HfConfigFields(config, "config.json"), "test_arch");
  EXPECT_EQ(section.model.to_flow(), "{type: test_hf_a, width: 5}");

  const PluginRecord* rb = record_for(host, "libloom-test-hf-b.so");
  ASSERT_NE(rb, nullptr);
  EXPECT_EQ(rb->status, PluginRecord::Status::failed);
  EXPECT_NE(rb->reason.find("Hugging Face model_type \"test_arch\" is already claimed by " + a +
                            " (model 'test_hf_a'); " + b + " claims it too"),
            std::string::npos)
      << rb->reason;
  EXPECT_EQ(registry.find("model", "test_hf_b"), nullptr);

  const PluginRecord* old = record_for(host, "libloom-test-hf-old.so");
  ASSERT_NE(old, nullptr);
  EXPECT_EQ(old->status, PluginRecord::Status::loaded) << old->reason;
  EXPECT_NE(registry.find("model", "test_hf_old"), nullptr);
  ASSERT_EQ(registry.hf_architectures().size(), 1u);
  EXPECT_EQ(registry.find_hf_architecture("unused"), nullptr);
}

// A plugin's tokenizer classes (Registrar::add_hf_tokenizer_class) are registered with its file,
// found by name (a fast twin's too) and by model_type. Another plugin may declare the same class
// with the same tokens; one that declares it with other tokens, or gives a model_type a second
// class, fails as a whole (its model is not registered either), naming both files.
TEST(PluginHost, APluginsTokenizerClassesAreRegisteredAndTheirConflictsRefused) {
  Registry registry;
  PluginHost host;
  host.load({{fixture_dir("hf_tokenizer"), "test"}}, registry);
  auto file = [](const char* name) { return fs::canonical(fixture_dir("hf_tokenizer") / name).string(); };
  const HfTokenizerClassEntry* by_type = registry.find_hf_tokenizer_class_of("test_tok_arch");
  ASSERT_NE(by_type, nullptr);
  EXPECT_EQ(by_type->plugin_file, file("libloom-test-tok-a.so"));
  EXPECT_EQ(by_type->decl.name, "TestTokenizer");
  EXPECT_EQ(by_type->decl.bos_token, std::optional<std::string>("<t-bos>"));
  EXPECT_EQ(by_type->decl.eos_token, std::optional<std::string>("<t-eos>"));
  EXPECT_EQ(registry.find_hf_tokenizer_class("TestTokenizerFast"), by_type);
  EXPECT_EQ(registry.find_hf_tokenizer_class("TestTokenizer"), by_type);
  EXPECT_EQ(registry.find_hf_tokenizer_class("Fast"), nullptr);
  EXPECT_EQ(registry.find_hf_tokenizer_class("LlamaTokenizer"), nullptr);
  ASSERT_NE(registry.find_hf_tokenizer_class_of("test_tok_more"), nullptr);
  EXPECT_EQ(registry.find_hf_tokenizer_class_of("test_tok_more")->plugin_file, file("libloom-test-tok-b.so"));
  EXPECT_EQ(registry.find_hf_tokenizer_class_of("test_tok_c_arch"), nullptr);

  const PluginRecord* c = record_for(host, "libloom-test-tok-c.so");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, PluginRecord::Status::failed);
  EXPECT_EQ(c->reason, "Hugging Face tokenizer class TestTokenizer is declared by " + file("libloom-test-tok-a.so") +
                           " and by " + file("libloom-test-tok-c.so") +
                           " with different default tokens (bos_token \"<t-bos>\" and eos_token \"<t-eos>\"; "
                           "bos_token none and eos_token \"<t-eos>\"); remove one of the two files from the plugin "
                           "path");
  EXPECT_EQ(registry.find("model", "test_tok_c"), nullptr);
  const PluginRecord* d = record_for(host, "libloom-test-tok-d.so");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->status, PluginRecord::Status::failed);
  EXPECT_EQ(d->reason, "the tokenizer class of Hugging Face model_type \"test_tok_arch\" is declared by " +
                           file("libloom-test-tok-a.so") + " and by " + file("libloom-test-tok-d.so") +
                           " (TestTokenizer, OtherTokenizer); remove one of the two files from the plugin path");
  EXPECT_EQ(registry.find("model", "test_tok_d"), nullptr);
  EXPECT_EQ(registry.find_hf_architecture("test_tok_d_arch"), nullptr);
  EXPECT_EQ(registry.find_hf_tokenizer_class("OtherTokenizer"), nullptr);
}

// A claim names a model of its own plugin, a mapping and at least one model_type.
TEST(PluginHost, AHuggingFaceClaimWithoutItsModelIsRefused) {
  Registry registry;
  auto mapping = [](const HfConfigFields&, const std::string&) { return HfModelSection{}; };
  try {
    registry.add({}, {HfArchitectureEntry{nullptr,
                                          {.model = "absent", .model_types = {"x"}, .model_section = mapping},
                                          "/plugins/libloom-model-x.so"}});
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "Hugging Face architectures are declared for model 'absent', which /plugins/libloom-model-x.so does not "
              "register");
  }
}

TEST(PluginHost, TheSameFileReachedTwiceLoadsOnce) {
  test::TempDir dir;
  fs::create_directory_symlink(fixture_dir("good"), dir.path() / "link");
  Registry registry;
  PluginHost host;
  host.load({{fixture_dir("good"), "first"},
             {dir.path() / "link", "second"},
             {fixture_dir("good"), "third"},
             {fixture_dir("good") / "libloom-test-good.so", "fourth"}},
            registry);
  ASSERT_EQ(host.plugins().size(), 1u);
  EXPECT_EQ(host.plugins()[0].origin, "first");
  EXPECT_EQ(host.plugins()[0].status, PluginRecord::Status::loaded);
}

TEST(PluginHost, EarlierDirectoriesShadowLaterFilesOfTheSameName) {
  Registry registry;
  PluginHost host;
  host.load({{fixture_dir("shadow"), "earlier"}, {fixture_dir("good"), "later"}}, registry);
  ASSERT_EQ(host.plugins().size(), 2u);
  EXPECT_EQ(host.plugins()[0].status, PluginRecord::Status::loaded);
  EXPECT_EQ(host.plugins()[1].status, PluginRecord::Status::shadowed);
  EXPECT_NE(host.plugins()[1].reason.find("shadowed by " +
                                          fs::canonical(fixture_dir("shadow") / "libloom-test-good.so").string()),
            std::string::npos);
  EXPECT_NE(registry.find("lr_schedule", "test_shadow"), nullptr);
  EXPECT_EQ(registry.find("lr_schedule", "test_scaled"), nullptr);
}

TEST(PluginHost, DiscoveryOrderIsCommandLineConfigEnvironmentExecutableInstall) {
  ::setenv("LOOM_PLUGIN_PATH", "/env/one::/env/two", 1);
  const auto search = PluginHost::default_search_path({{"/cli/a", "--plugin-path"}, {"/cli/b", "--plugin-path"}},
                                                      {{"/config/c", "plugins.paths"}});
  ::unsetenv("LOOM_PLUGIN_PATH");
  ASSERT_EQ(search.size(), 7u);
  EXPECT_EQ(search[0].path, "/cli/a");
  EXPECT_EQ(search[1].path, "/cli/b");
  EXPECT_EQ(search[2].path, "/config/c");
  EXPECT_EQ(search[3].path, "/env/one");
  EXPECT_EQ(search[3].origin, "LOOM_PLUGIN_PATH");
  EXPECT_EQ(search[4].path, "/env/two");
  EXPECT_EQ(search[5].origin, "next to the executable");
  EXPECT_EQ(search[6].origin, "install directory");
  // The executable-relative directory is <exe>/../lib/loom/plugins.
  EXPECT_EQ(search[5].path.filename(), "plugins");
  EXPECT_EQ(search[5].path.parent_path().filename(), "loom");
}

TEST(PluginHost, ConfigPluginPathsAreRelativeToTheConfigFile) {
  test::TempDir dir;
  const fs::path rel = fs::relative(fixture_dir("good"), dir.path() / "configs");
  const auto file = dir.write("configs/run.yaml", "plugins:\n  paths: [" + rel.string() + "]\n");
  RuntimeOptions options;
  options.config = file;
  Runtime runtime(options);
  EXPECT_NE(runtime.registry().find("tokenizer", "test_bytes"), nullptr);
  ASSERT_FALSE(runtime.plugin_host().plugins().empty());
  EXPECT_NE(runtime.plugin_host().plugins()[0].origin.find("plugins.paths at " + file.string() + ":2:11"),
            std::string::npos)
      << runtime.plugin_host().plugins()[0].origin;
}

TEST(PluginHost, CommandLinePathsComeBeforeConfigPaths) {
  test::TempDir dir;
  const auto file = dir.write("run.yaml", "plugins:\n  paths: [" + fixture_dir("good").string() + "]\n");
  RuntimeOptions options;
  options.config = file;
  options.plugin_paths = {fixture_dir("shadow").string()};
  Runtime runtime(options);
  // The shadow fixture has the good fixture's file name, so it wins and the good one is shadowed.
  EXPECT_NE(runtime.registry().find("lr_schedule", "test_shadow"), nullptr);
  EXPECT_EQ(runtime.registry().find("lr_schedule", "test_scaled"), nullptr);
}

TEST(AbiRecord, IsReadFromTheFileWithoutLoadingIt) {
  const AbiRecordInfo info = read_abi_record(fixture_dir("broken") / "libloom-test-abi-major.so");
  EXPECT_EQ(info.abi_major, 999u);
  EXPECT_EQ(info.sdk_version, sdk_version);
  EXPECT_NE(check_abi(info).find("ABI mismatch"), std::string::npos);
  // The record of a plugin built with this build's flags names its instruction set.
  const AbiRecordInfo good = read_abi_record(fixture_dir("good") / "libloom-test-good.so");
  EXPECT_EQ(good.isa, host_isa());
  EXPECT_EQ(check_abi(good), "");
}

TEST(AbiRecord, AMajorMismatchSaysWhichSdkToRebuildAgainst) {
  AbiRecordInfo old{abi_major - 1, 0, sdk_version, host_build_tag(), host_isa()};
  const std::string why = check_abi(old);
  EXPECT_NE(why.find("the plugin has ABI " + std::to_string(abi_major - 1) + ".0 (SDK " + sdk_version +
                     "), this loom has ABI " + std::to_string(abi_major) + "." + std::to_string(abi_minor)),
            std::string::npos)
      << why;
  // Not "rebuild against loom <its own version>'s SDK", which it may well have been.
  EXPECT_NE(why.find("rebuild the plugin against the SDK installed with this loom (its loom/version.hpp says ABI " +
                     std::to_string(abi_major) + "."),
            std::string::npos)
      << why;
}

TEST(AbiRecord, CompatibilityRules) {
  AbiRecordInfo same{abi_major, abi_minor, sdk_version, host_build_tag(), host_isa()};
  EXPECT_EQ(check_abi(same), "");
  AbiRecordInfo newer_minor = same;
  newer_minor.abi_minor = abi_minor + 1;
  EXPECT_NE(check_abi(newer_minor).find("newer than this loom's"), std::string::npos);
  AbiRecordInfo older_minor = same;
  if (abi_minor > 0) {
    older_minor.abi_minor = abi_minor - 1;
    EXPECT_EQ(check_abi(older_minor), "");
  }
  // The compiler's name is not what decides: another compiler with the same C++ ABI, standard
  // library and dual ABI loads.
  const std::string stdlib = "stdlib=libstdc++-" + std::to_string(_GLIBCXX_RELEASE);
  AbiRecordInfo clang = same;
  clang.build_tag = "clang-14.0;cxxabi=itanium;" + stdlib + ";cxx11abi=1";
  EXPECT_EQ(check_abi(clang), "");
  AbiRecordInfo other_abi = same;
  other_abi.build_tag = "clang-14.0;cxxabi=itanium;" + stdlib + ";cxx11abi=0";
  EXPECT_NE(check_abi(other_abi).find("the plugin uses libstdc++ ABI cxx11abi=0, this loom uses 1"), std::string::npos)
      << check_abi(other_abi);
  AbiRecordInfo libcxx = same;
  libcxx.build_tag = "clang-14.0;cxxabi=itanium;stdlib=libc++-14000";
  EXPECT_NE(check_abi(libcxx).find("is built against libc++, this loom against libstdc++"), std::string::npos)
      << check_abi(libcxx);
  EXPECT_NE(check_abi(libcxx).find("(without -stdlib=libc++)"), std::string::npos);
  AbiRecordInfo newer = same;
  newer.build_tag = "gcc-99.1;cxxabi=itanium;stdlib=libstdc++-99;cxx11abi=1";
  EXPECT_NE(check_abi(newer).find("is built against libstdc++ 99's headers, newer than this loom's libstdc++ " +
                                  std::to_string(_GLIBCXX_RELEASE)),
            std::string::npos)
      << check_abi(newer);
  AbiRecordInfo older = same;
  older.build_tag = "gcc-7.5;cxxabi=itanium;stdlib=libstdc++-7;cxx11abi=1";
  EXPECT_EQ(check_abi(older), "");
  AbiRecordInfo no_cxxabi = same;
  no_cxxabi.build_tag = "msvc-19;cxxabi=unknown;stdlib=unknown";
  EXPECT_NE(check_abi(no_cxxabi).find("follows the unknown C++ ABI, this loom the itanium one"), std::string::npos)
      << check_abi(no_cxxabi);
  // A library a plugin links privately is none of the host's business: the Eigen version older
  // SDKs recorded is ignored.
  EXPECT_EQ(host_build_tag().find("eigen"), std::string::npos) << host_build_tag();
  AbiRecordInfo with_eigen = same;
  with_eigen.build_tag = host_build_tag() + ";eigen=2.0.0";
  EXPECT_EQ(check_abi(with_eigen), "");
}

TEST(Isa, TheLevelsAndExtensionsARecordNeedsAgainstACpu) {
  const std::vector<std::string> v3 = {"sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16",  "lahf_sahf", "avx",
                                       "avx2", "bmi",   "bmi2",   "f16c",   "fma",    "lzcnt", "movbe",     "xsave"};
  std::vector<std::string> v4 = v3;
  for (const char* f : {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}) v4.emplace_back(f);
  std::vector<std::string> zen4 = v4;
  zen4.emplace_back("avx512bf16");
  EXPECT_EQ(describe_cpu(v3), "x86-64-v3");
  EXPECT_EQ(describe_cpu(zen4), "x86-64-v4+avx512bf16");
  EXPECT_EQ(check_isa("x86-64", v3), "");
  EXPECT_EQ(check_isa("x86-64-v3", v3), "");
  EXPECT_EQ(check_isa("x86-64-v4+avx512bf16", zen4), "");
  EXPECT_EQ(check_isa("x86-64-v2+avx+avx2+fma", v3), "");
  EXPECT_EQ(check_isa("x86-64-v4+avx512bf16", v3),
            "instruction set: the plugin needs avx512f, avx512bw, avx512cd, avx512dq, avx512vl, avx512bf16, which "
            "this CPU (x86-64-v3) lacks: it is built for x86-64-v4+avx512bf16 (-march=native on another machine?); "
            "rebuild it without -march=native, or with -march=x86-64-v3 or lower (this loom is built for " +
                host_isa().substr(0, host_isa().find('+')) + ")");
  EXPECT_NE(check_isa("x86-64-v3+avx1024", v3).find("needs avx1024, which this loom cannot check"), std::string::npos);
  EXPECT_NE(check_isa("", v3).find("names none"), std::string::npos);
  EXPECT_NE(check_isa("riscv64", v3).find("the plugin is built for riscv64"), std::string::npos);
}

TEST(Isa, TheDetectedExtensionsAgreeWithProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  // LOOM_BUILD_ISA's names (GCC's) where the kernel's differ.
  const std::pair<const char*, const char*> renamed[] = {{"sse3", "pni"},
                                                         {"bmi", "bmi1"},
                                                         {"sse4.1", "sse4_1"},
                                                         {"sse4.2", "sse4_2"},
                                                         {"lahf_sahf", "lahf_lm"},
                                                         {"lzcnt", "abm"},
                                                         {"pclmul", "pclmulqdq"},
                                                         {"rdrnd", "rdrand"},
                                                         {"sha", "sha_ni"},
                                                         {"avxvnni", "avx_vnni"},
                                                         {"amx-tile", "amx_tile"},
                                                         {"amx-bf16", "amx_bf16"},
                                                         {"amx-int8", "amx_int8"},
                                                         {"avx512vnni", "avx512_vnni"},
                                                         {"avx512bf16", "avx512_bf16"},
                                                         {"avx512vbmi2", "avx512_vbmi2"},
                                                         {"avx512bitalg", "avx512_bitalg"},
                                                         {"avx512vpopcntdq", "avx512_vpopcntdq"},
                                                         {"avx512fp16", "avx512_fp16"},
                                                         {"avx512vp2intersect", "avx512_vp2intersect"}};
  const std::vector<std::string> cpu = host_cpu_features();
  ASSERT_FALSE(cpu.empty());
  for (const auto& f : cpu) {
    // The kernel clears these on CPUs with errata in them (RDSEED on Zen 5); compilers emit them
    // only for their intrinsics.
    if (f == "rdseed" || f == "rdrnd") continue;
    std::string kernel_name = f;
    for (const auto& [ours, theirs] : renamed)
      if (f == ours) kernel_name = theirs;
    EXPECT_NE(flags.find(" " + kernel_name + " "), std::string::npos) << f << " detected, not in /proc/cpuinfo";
  }
  // And the converse for the levels' extensions.
  for (const char* f : {"avx2", "fma", "bmi2", "avx512f", "avx512bw", "avx512bf16"}) {
    std::string kernel_name = f;
    for (const auto& [ours, theirs] : renamed)
      if (kernel_name == ours) kernel_name = theirs;
    const bool listed = flags.find(" " + kernel_name + " ") != std::string::npos;
    EXPECT_EQ(listed, std::find(cpu.begin(), cpu.end(), f) != cpu.end()) << f;
  }
  // The host itself runs here, so the CPU has what it was built for.
  EXPECT_EQ(check_isa(host_isa(), cpu), "");
}

}  // namespace
}  // namespace loom
