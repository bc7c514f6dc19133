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
};

// Every variable, in the order `softrdma config` and docs/debugging.md list them.
std::span<const Variable> table();
const Variable* find(std::string_view name);

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
  bool gso = true;                                 // SOFTRDMA_GSO
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
  std::string lib_dir;                             // SOFTRDMA_LIB_DIR ("": <dir of softrdma>/../lib)
  bool view = true;                                // SOFTRDMA_VIEW
};

// A variable's value by name: nullptr when unset.
using Lookup = std::function<const char*(const char* name)>;

// The settings the lookup gives; parse() with no argument reads the process environment now.
// Consumers call it when the code they configure starts (a context, a port, a connection), so a
// process may open contexts with different settings.
Settings parse(const Lookup& lookup);
Settings parse();

}  // namespace softrdma::config
