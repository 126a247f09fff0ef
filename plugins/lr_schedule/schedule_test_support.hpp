// What the lr_schedule plugins' tests share: loading the one plugin under test (its file is the
// LOOM_PLUGIN_FILE compile definition) through the real host, and creating its schedule from a
// YAML map of options.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "loom/core/config.hpp"
#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/kinds/lr_schedule.hpp"

namespace loom::test {

// Rates are computed in double; expected values are exact up to a few roundings.
constexpr double kTol = 1e-12;

// The plugin, loaded once for the whole test and never unloaded: an exception made by the
// plugin's code (its vtable is the plugin's) must not outlive the library.
inline Registry& schedule_registry() {
  static Registry r;
  static const bool loaded = [] {
    PluginHost host;
    host.load({{LOOM_PLUGIN_FILE, "test"}}, r);
    for (const auto& p : host.plugins()) EXPECT_EQ(p.status, PluginRecord::Status::loaded) << p.reason;
    return true;
  }();
  (void)loaded;
  return r;
}

// The schedule `type` configured by the YAML map `options` ("{warmup: 10}").
inline Handle<LrSchedule> make_schedule(const std::string& type, std::string_view options) {
  Value node = config::load_string(options, "schedule.yaml");
  node.set("type", type);
  return schedule_registry().create<LrSchedule>({"lr_schedule", type, node, "lr_schedule"});
}

}  // namespace loom::test
