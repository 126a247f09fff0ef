// The plugin host: discovery order, de-duplication, shadowing, duplicate names, every way a
// plugin can fail, and handles that keep their library loaded.
#include "loom/core/plugin_host.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
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
      {"libloom-test-build-tag.so", "build mismatch: the plugin was built with gcc-3.4"},
      {"libloom-test-fails.so", "register function failed: the test plugin reports an error"},
      {"libloom-test-throws.so", "register function failed: the test plugin refuses to register"},
      {"libloom-test-undefined.so", "loom_test_symbol_that_does_not_exist"},
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
}

TEST(AbiRecord, CompatibilityRules) {
  AbiRecordInfo same{abi_major, abi_minor, sdk_version, host_build_tag()};
  EXPECT_EQ(check_abi(same), "");
  AbiRecordInfo newer_minor = same;
  newer_minor.abi_minor = abi_minor + 1;
  EXPECT_NE(check_abi(newer_minor).find("newer than this loom's"), std::string::npos);
  AbiRecordInfo older_minor = same;
  if (abi_minor > 0) {
    older_minor.abi_minor = abi_minor - 1;
    EXPECT_EQ(check_abi(older_minor), "");
  }
  AbiRecordInfo other_abi = same;
  other_abi.build_tag = std::string(LOOM_DETAIL_COMPILER) + ";cxx11abi=0";
  EXPECT_NE(check_abi(other_abi).find("libstdc++ ABI"), std::string::npos);
  // A library a plugin links privately is none of the host's business: the Eigen version older
  // SDKs recorded is ignored.
  EXPECT_EQ(host_build_tag().find("eigen"), std::string::npos) << host_build_tag();
  AbiRecordInfo with_eigen = same;
  with_eigen.build_tag = std::string(LOOM_DETAIL_COMPILER) + ";cxx11abi=1;eigen=2.0.0";
  EXPECT_EQ(check_abi(with_eigen), "");
}

}  // namespace
}  // namespace loom
