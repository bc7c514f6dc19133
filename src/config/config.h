// The one table of softrdma's environment variables: every SOFTRDMA_* variable the libraries, the
// softrdma command, the tests and the scripts read, with its type, default and one line of help.
// `softrdma config` prints it and docs/debugging.md is checked against it (ctest tools.config_docs).
// The libraries and the command read their variables only through here (Settings); the tests' and
// the scripts' own variables are listed for completeness. A leaf module: every layer may include it.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace softrdma::config {

enum class Type {
  Bool,    // 1 or 0; any other value means the default
  Flag,    // set to anything (not empty): on
  Uint,    // decimal
  Octal,   // a file mode
  Choice,  // one word of those the help names
  Text,    // free text (a spec, a key)
  Path,
};
const char* type_name(Type t);

struct Variable {
  const char* name;
  Type type;
  const char* fallback;  // the default, as a user would write it ("" when unset means "none")
  const char* reader;    // who reads it: libibverbs, librdmacm, softrdma, tests, a script
  const char* help;
  const char* choices = nullptr;  // a Choice's words, separated by spaces
};

// Every variable, in the order `softrdma config` and docs/debugging.md list them.
std::span<const Variable> table();
const Variable* find(std::string_view name);

// Whether the variable's type takes `value`: "" (the default) always; a Bool 0 or 1, a Uint decimal
// digits (64 bits), an Octal octal digits up to 0777, a Choice one of its words; a Flag, a Text and a
// Path anything. The parser itself is more lenient (a value it does not take means the default); the
// settings a program passes without the environment (below) are checked with this.
bool accepts(const Variable& v, std::string_view value);

// Settings written out, "SOFTRDMA_X=v;SOFTRDMA_Y=w" (a value cannot hold ';'; "" is none), as
// (name, value) pairs in their order; nullopt when one is not NAME=VALUE, names no variable of the
// table, or has a value its type does not take (accepts).
using Assignments = std::vector<std::pair<std::string, std::string>>;
std::optional<Assignments> parse_assignments(std::string_view text);

enum class Transport { Roce = 0, Iwarp = 1, Both = 2 };  // also an index (verbs/device.cpp)
enum class DirectPeers { User, Group, Any };

// The parsed values of the variables the libraries and the softrdma command read. Unset and empty
// are the same: the default.
struct Settings {
  // libibverbs
  Transport transport = Transport::Roce;           // SOFTRDMA_TRANSPORT
  bool direct = true;                              // SOFTRDMA_DIRECT; off under SOFTRDMA_IMPAIR unless set
  DirectPeers direct_peers = DirectPeers::User;    // SOFTRDMA_DIRECT_PEERS
  std::string impair;                              // SOFTRDMA_IMPAIR, the spec (net/impairment.h)
  uint64_t spin_us = 200;                          // SOFTRDMA_SPIN_US
  uint64_t peer_pause_ms = 60000;                  // SOFTRDMA_PEER_PAUSE_MS
  bool gso = true;                                 // SOFTRDMA_GSO
  std::string capture;                             // SOFTRDMA_CAPTURE ("": no capture)
  bool counters = false;                           // SOFTRDMA_COUNTERS
  std::optional<uint32_t> stats_mode;              // SOFTRDMA_STATS_MODE; nullopt: not octal or unset
  std::string registry;                            // SOFTRDMA_REGISTRY ("": the default path)
  std::string tuples;                              // SOFTRDMA_TUPLES ("": the default path)
  std::string wire_protect, auth_key, auth_key_file;  // SOFTRDMA_WIRE_PROTECT, _AUTH_KEY, _AUTH_KEY_FILE
  // librdmacm
  uint64_t cm_timeout_ms = 1000;                   // SOFTRDMA_CM_TIMEOUT_MS
  uint64_t cm_retries = 15;                        // SOFTRDMA_CM_RETRIES
  uint64_t cm_probe_ms = 2000;                     // SOFTRDMA_CM_PROBE_MS
  std::optional<uint64_t> mpa_timeout_ms;          // SOFTRDMA_MPA_TIMEOUT_MS; nullopt: siw's timers
  bool mpa_crc = false;                            // SOFTRDMA_MPA_CRC
  // the softrdma command
  std::string lib_dir;                             // SOFTRDMA_LIB_DIR ("": found next to softrdma)
  bool view = true;                                // SOFTRDMA_VIEW
};

// A variable's value by name: nullptr when unset.
using Lookup = std::function<const char*(const char* name)>;

// The settings the lookup gives; parse() with no argument reads the process's settings now: its
// options (set_option), then its environment. Consumers call it when the code they configure starts
// (a context, a port, a connection), so a process may open contexts with different settings.
Settings parse(const Lookup& lookup);
Settings parse();
// The settings of `first` (a context's own, parse_assignments), then the process's as parse().
Settings parse(const Assignments& first);

// The process's options: a value set here wins over the environment's in every parse() after, in
// this copy of the module (each of softrdma's libraries links its own: their private ABIs,
// softrdma_set_option and softrdma_cm_set_option, set it). For in-process tests, which so configure
// the code they test without setenv. value nullptr: the environment's value again; "": the default,
// whatever the environment says. false, and nothing changes, when the name is not in the table or the
// type does not take the value (accepts). Thread-safe.
bool set_option(std::string_view name, const char* value);

}  // namespace softrdma::config
