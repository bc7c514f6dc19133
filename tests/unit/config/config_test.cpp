// The configuration table (config/config.h): each variable parsed from a given lookup (no setenv),
// the defaults taken from the table, and the one definition of the direct path's switch; the values
// each type takes, settings written out ("SOFTRDMA_X=v;..."), and the process's options over the
// environment (the one case that sets it: what it tests is that reading).
#include "config/config.h"

#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

namespace softrdma::config {
namespace {

Settings parse_of(const std::map<std::string, std::string>& env) {
  return parse([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(ConfigTable, EveryRowIsNamedTypedAndExplained) {
  std::set<std::string> names;
  for (const Variable& v : table()) {
    const std::string name = v.name;
    EXPECT_EQ(name.rfind("SOFTRDMA_", 0), 0u) << name;
    EXPECT_TRUE(names.insert(name).second) << name << " twice";
    EXPECT_NE(std::string(v.help), "") << name;
    EXPECT_NE(std::string(v.reader), "") << name;
    EXPECT_NE(std::string(type_name(v.type)), "?") << name;
    EXPECT_EQ(find(name), &v);
  }
  EXPECT_EQ(find("SOFTRDMA_NO_SUCH_VARIABLE"), nullptr);
  EXPECT_EQ(find("FAULT_SEED"), nullptr) << "the fault tests' own variables are not softrdma's";
}

// Unset, and set but empty, give the table's defaults, which are also Settings' own.
TEST(ConfigTable, DefaultsComeFromTheTable) {
  for (const auto& env : {std::map<std::string, std::string>{},
                          std::map<std::string, std::string>{{"SOFTRDMA_SPIN_US", ""}, {"SOFTRDMA_GSO", ""},
                                                             {"SOFTRDMA_CM_RETRIES", ""}}}) {
    const Settings s = parse_of(env);
    const Settings d;
    EXPECT_EQ(s.spin_us, d.spin_us);
    EXPECT_EQ(std::to_string(s.spin_us), find("SOFTRDMA_SPIN_US")->fallback);
    EXPECT_EQ(std::to_string(s.cm_timeout_ms), find("SOFTRDMA_CM_TIMEOUT_MS")->fallback);
    EXPECT_EQ(std::to_string(s.cm_retries), find("SOFTRDMA_CM_RETRIES")->fallback);
    EXPECT_EQ(std::to_string(s.cm_probe_ms), find("SOFTRDMA_CM_PROBE_MS")->fallback);
    EXPECT_EQ(s.cm_timeout_ms, d.cm_timeout_ms);
    EXPECT_EQ(s.cm_retries, d.cm_retries);
    EXPECT_EQ(s.cm_probe_ms, d.cm_probe_ms);
    EXPECT_EQ(std::to_string(s.peer_pause_ms), find("SOFTRDMA_PEER_PAUSE_MS")->fallback);
    EXPECT_EQ(s.peer_pause_ms, d.peer_pause_ms);
    EXPECT_EQ(s.gso, d.gso);
    EXPECT_TRUE(s.gso);
    EXPECT_FALSE(s.mpa_crc);
    EXPECT_TRUE(s.view);
    EXPECT_TRUE(s.direct);
    EXPECT_FALSE(s.counters);
    EXPECT_EQ(s.transport, Transport::Roce);
    EXPECT_EQ(s.direct_peers, DirectPeers::User);
    EXPECT_FALSE(s.mpa_timeout_ms.has_value());
    EXPECT_FALSE(s.stats_mode.has_value());
    EXPECT_EQ(s.registry, "");
    EXPECT_EQ(s.impair, "");
  }
}

TEST(ConfigTable, ValuesAreParsedByType) {
  const Settings s = parse_of({{"SOFTRDMA_SPIN_US", "7"},
                               {"SOFTRDMA_GSO", "0"},
                               {"SOFTRDMA_MPA_CRC", "1"},
                               {"SOFTRDMA_VIEW", "0"},
                               {"SOFTRDMA_COUNTERS", "0"},  // a flag: set is on, whatever the value
                               {"SOFTRDMA_TRANSPORT", "both"},
                               {"SOFTRDMA_DIRECT_PEERS", "group"},
                               {"SOFTRDMA_MPA_TIMEOUT_MS", "1500"},
                               {"SOFTRDMA_STATS_MODE", "0640"},
                               {"SOFTRDMA_REGISTRY", "mine"},
                               {"SOFTRDMA_CM_RETRIES", "2"}});
  EXPECT_EQ(s.spin_us, 7u);
  EXPECT_FALSE(s.gso);
  EXPECT_TRUE(s.mpa_crc);
  EXPECT_FALSE(s.view);
  EXPECT_TRUE(s.counters);
  EXPECT_EQ(s.transport, Transport::Both);
  EXPECT_EQ(s.direct_peers, DirectPeers::Group);
  EXPECT_EQ(s.mpa_timeout_ms, 1500u);
  EXPECT_EQ(s.stats_mode, 0640u);
  EXPECT_EQ(s.registry, "mine");
  EXPECT_EQ(s.cm_retries, 2u);
  // What a choice or a bool does not know means the default; so does a mode that is not octal.
  const Settings odd = parse_of({{"SOFTRDMA_GSO", "no"},
                                 {"SOFTRDMA_MPA_CRC", "yes"},
                                 {"SOFTRDMA_TRANSPORT", "infiniband"},
                                 {"SOFTRDMA_DIRECT_PEERS", "everyone"},
                                 {"SOFTRDMA_STATS_MODE", "rw-r--r--"}});
  EXPECT_TRUE(odd.gso);
  EXPECT_FALSE(odd.mpa_crc);
  EXPECT_EQ(odd.transport, Transport::Roce);
  EXPECT_EQ(odd.direct_peers, DirectPeers::User) << "the safe choice";
  EXPECT_FALSE(odd.stats_mode.has_value());
  EXPECT_FALSE(parse_of({{"SOFTRDMA_STATS_MODE", "01777"}}).stats_mode.has_value());
}

// The bug of issue 26: the engine turned the direct path off under SOFTRDMA_IMPAIR while iWARP's
// connection setup (librdmacm, libibverbs) did not. One definition now: every reader gets this.
TEST(ConfigTable, DirectPathIsOffUnderImpairUnlessAskedFor) {
  EXPECT_TRUE(parse_of({}).direct);
  EXPECT_FALSE(parse_of({{"SOFTRDMA_DIRECT", "0"}}).direct);
  EXPECT_FALSE(parse_of({{"SOFTRDMA_IMPAIR", "seed=1,tx_drop=0.1"}}).direct);
  EXPECT_TRUE(parse_of({{"SOFTRDMA_IMPAIR", "seed=1,tx_drop=0.1"}, {"SOFTRDMA_DIRECT", "1"}}).direct);
  EXPECT_FALSE(parse_of({{"SOFTRDMA_IMPAIR", "seed=1"}, {"SOFTRDMA_DIRECT", "0"}}).direct);
}

// A choice names its words, and its default is one of them.
TEST(ConfigTable, ChoicesNameTheirWords) {
  for (const Variable& v : table()) {
    if (v.type != Type::Choice) continue;
    ASSERT_NE(v.choices, nullptr) << v.name;
    EXPECT_TRUE(accepts(v, v.fallback)) << v.name << "'s default " << v.fallback;
  }
  EXPECT_TRUE(accepts(*find("SOFTRDMA_TRANSPORT"), "both"));
  EXPECT_TRUE(accepts(*find("SOFTRDMA_WIRE_PROTECT"), "encrypt"));
  EXPECT_TRUE(accepts(*find("SOFTRDMA_DIRECT_PEERS"), "any"));
  EXPECT_FALSE(accepts(*find("SOFTRDMA_TRANSPORT"), "roc"));
  EXPECT_FALSE(accepts(*find("SOFTRDMA_TRANSPORT"), "roce iwarp"));
  EXPECT_FALSE(accepts(*find("SOFTRDMA_DIRECT_PEERS"), "everyone"));
}

TEST(ConfigTable, AcceptsWhatEachTypeTakes) {
  const Variable& b = *find("SOFTRDMA_DIRECT");
  const Variable& u = *find("SOFTRDMA_SPIN_US");
  const Variable& o = *find("SOFTRDMA_STATS_MODE");
  for (const Variable* v : {&b, &u, &o, find("SOFTRDMA_TRANSPORT"), find("SOFTRDMA_COUNTERS")})
    EXPECT_TRUE(accepts(*v, "")) << v->name << ": empty is the default";
  struct Case {
    const Variable& var;
    const char* value;
    bool taken;
  };
  const Case cases[] = {
      {b, "0", true},           {b, "1", true},
      {b, "yes", false},        {b, "2", false},
      {u, "0", true},           {u, "18446744073709551615", true},
      {u, "18446744073709551616", false},  // past 64 bits
      {u, "-1", false},         {u, "10ms", false},
      {o, "0640", true},        {o, "777", true},
      {o, "01777", false},      {o, "0680", false},
  };
  for (const Case& c : cases) EXPECT_EQ(accepts(c.var, c.value), c.taken) << c.var.name << "=" << c.value;
  EXPECT_TRUE(accepts(*find("SOFTRDMA_COUNTERS"), "anything"));
  EXPECT_TRUE(accepts(*find("SOFTRDMA_IMPAIR"), "seed=1,tx_drop=0.1"));
}

TEST(ConfigAssignments, NameEqualsValueSeparatedBySemicolons) {
  auto a = parse_assignments("SOFTRDMA_IMPAIR=seed=1,tx_drop=0.1;SOFTRDMA_DIRECT=1;SOFTRDMA_GSO=");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (Assignments{{"SOFTRDMA_IMPAIR", "seed=1,tx_drop=0.1"}, {"SOFTRDMA_DIRECT", "1"}, {"SOFTRDMA_GSO", ""}}));
  EXPECT_EQ(parse_assignments(""), Assignments{});
  EXPECT_EQ(parse_assignments("SOFTRDMA_SPIN_US=0;"), (Assignments{{"SOFTRDMA_SPIN_US", "0"}}));
  EXPECT_FALSE(parse_assignments("SOFTRDMA_NO_SUCH=1")) << "a name not in the table";
  EXPECT_FALSE(parse_assignments("softrdma_direct=0")) << "names are exact";
  EXPECT_FALSE(parse_assignments("SOFTRDMA_DIRECT")) << "no value";
  EXPECT_FALSE(parse_assignments("SOFTRDMA_DIRECT=0;;SOFTRDMA_GSO=0")) << "an empty item";
  EXPECT_FALSE(parse_assignments("SOFTRDMA_DIRECT=off")) << "a value its type does not take";
  EXPECT_FALSE(parse_assignments("SOFTRDMA_GSO=0;SOFTRDMA_SPIN_US=fast"));
}

// parse() reads a context's own settings, then the process's options, then the environment; an option
// set to "" is the default whatever the environment says, and nullptr gives the environment back.
TEST(ConfigOptions, WinOverTheEnvironmentUntilCleared) {
  ASSERT_EQ(setenv("SOFTRDMA_SPIN_US", "7", 1), 0);
  EXPECT_EQ(parse().spin_us, 7u);
  ASSERT_TRUE(set_option("SOFTRDMA_SPIN_US", "9"));
  EXPECT_EQ(parse().spin_us, 9u);
  EXPECT_EQ(parse(Assignments{{"SOFTRDMA_SPIN_US", "11"}}).spin_us, 11u) << "a context's own wins";
  EXPECT_EQ(parse(Assignments{{"SOFTRDMA_GSO", "0"}}).spin_us, 9u) << "and names only what it names";
  ASSERT_TRUE(set_option("SOFTRDMA_SPIN_US", ""));
  EXPECT_EQ(parse().spin_us, Settings{}.spin_us);
  EXPECT_FALSE(set_option("SOFTRDMA_SPIN_US", "fast"));
  EXPECT_EQ(parse().spin_us, Settings{}.spin_us) << "a refused value changes nothing";
  EXPECT_FALSE(set_option("SOFTRDMA_NO_SUCH", "1"));
  ASSERT_TRUE(set_option("SOFTRDMA_SPIN_US", nullptr));
  EXPECT_EQ(parse().spin_us, 7u);
  ASSERT_EQ(unsetenv("SOFTRDMA_SPIN_US"), 0);
  EXPECT_EQ(parse().spin_us, Settings{}.spin_us);
  ASSERT_TRUE(set_option("SOFTRDMA_TRANSPORT", "iwarp"));
  EXPECT_EQ(parse().transport, Transport::Iwarp);
  ASSERT_TRUE(set_option("SOFTRDMA_TRANSPORT", nullptr));
}

}  // namespace
}  // namespace softrdma::config
