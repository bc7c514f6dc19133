// The table of environment variables and its parser (config.h).
#include "config/config.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace softrdma::config {
namespace {

constexpr Variable kTable[] = {
    // libibverbs: read when devices are listed, a context opens or a port opens.
    {"SOFTRDMA_TRANSPORT", Type::Choice, "roce", "libibverbs",
     "devices offered: `roce`, `iwarp` (iWARP only, as a siw host) or `both` (RoCE first)", "roce iwarp both"},
    {"SOFTRDMA_DIRECT", Type::Bool, "1 (0 under SOFTRDMA_IMPAIR)", "libibverbs, librdmacm",
     "`0`: no intra-host direct path, every operation by packets or TCP; `1`: even under SOFTRDMA_IMPAIR"},
    {"SOFTRDMA_DIRECT_PEERS", Type::Choice, "user", "libibverbs",
     "whom a context's direct-path server answers: `user` (our uid or root), `group` (also our primary "
     "group), `any`; refusals counted in `direct_refused` (docs/security.md)", "user group any"},
    {"SOFTRDMA_IMPAIR", Type::Text, "", "libibverbs",
     "deterministic packet faults on the UDP ports, e.g. `seed=42,tx_drop=0.05,rx_dup=0.01` (keys in "
     "src/net/impairment.h)"},
    {"SOFTRDMA_SPIN_US", Type::Uint, "200", "libibverbs",
     "how long the progress thread spins after its last work before it blocks (microseconds)"},
    {"SOFTRDMA_PEER_PAUSE_MS", Type::Uint, "60000", "libibverbs",
     "how long an RC requester keeps resending, past retry_cnt, to a peer whose host and process are "
     "known to exist (a paused or starved process); `0`: IBTA retry counting only (docs/reliability.md)"},
    {"SOFTRDMA_GSO", Type::Bool, "1", "libibverbs",
     "`0`: no UDP segmentation/receive offload, one datagram per packet (docs/architecture.md)"},
    {"SOFTRDMA_CAPTURE", Type::Path, "", "libibverbs",
     "append every RoCE packet of this process to this pcapng file, as `softrdma capture` does "
     "(docs/debugging.md)"},
    {"SOFTRDMA_COUNTERS", Type::Flag, "", "libibverbs",
     "set: each context prints its nonzero counters to stderr when it closes (docs/reliability.md)"},
    {"SOFTRDMA_STATS_MODE", Type::Octal, "0600", "libibverbs",
     "mode of the stats pages `/dev/shm/softrdma-stats-*`: `0640`/`0644` let `softrdma stat` of other "
     "users see them; write bits for others are never granted"},
    {"SOFTRDMA_REGISTRY", Type::Path, "/dev/shm/softrdma-registry-<netns inode>", "libibverbs",
     "base path of the host-local QPN registry (files `<base>-u<uid>`, docs/security.md); set it to "
     "isolate a run"},
    {"SOFTRDMA_TUPLES", Type::Path, "/dev/shm/softrdma-tuples-<netns inode>", "libibverbs, librdmacm",
     "base path of the iWARP direct path's 4-tuple table (files `<base>-u<uid>`)"},
    {"SOFTRDMA_WIRE_PROTECT", Type::Choice, "off", "libibverbs, librdmacm",
     "protection of the RC/UC packets of connections the CM sets up: `off`, `auth` or `encrypt` "
     "(docs/security.md)", "off auth encrypt"},
    {"SOFTRDMA_AUTH_KEY", Type::Text, "", "libibverbs, librdmacm",
     "the operator key for SOFTRDMA_WIRE_PROTECT, in hex (at least 16 bytes)"},
    {"SOFTRDMA_AUTH_KEY_FILE", Type::Path, "", "libibverbs, librdmacm",
     "a file (mode `0600`) holding the operator key (hex or raw); wins over SOFTRDMA_AUTH_KEY"},
    // librdmacm
    {"SOFTRDMA_CM_TIMEOUT_MS", Type::Uint, "1000", "librdmacm",
     "how long a CM message waits for its answer before it is sent again (docs/rdmacm.md)"},
    {"SOFTRDMA_CM_RETRIES", Type::Uint, "15", "librdmacm", "resends of a CM message before UNREACHABLE"},
    {"SOFTRDMA_CM_PROBE_MS", Type::Uint, "2000", "librdmacm",
     "how often a connection to another host checks that its peer process still exists"},
    {"SOFTRDMA_MPA_TIMEOUT_MS", Type::Uint, "10000 (reply), 5000 (request)", "librdmacm",
     "how long iWARP connection setup waits for the MPA reply and request (both)"},
    {"SOFTRDMA_MPA_CRC", Type::Bool, "0", "librdmacm", "`1`: ask for MPA CRCs on every FPDU (docs/iwarp.md)"},
    // the softrdma command
    {"SOFTRDMA_LIB_DIR", Type::Path, "<dir of softrdma>/../lib/softrdma (installed), ../lib (build)", "softrdma",
     "directory of the libraries `softrdma run` gives the program"},
    {"SOFTRDMA_VIEW", Type::Bool, "1", "softrdma",
     "`0`: no device view: the program sees the host's `/sys` and `/dev` (as `--no-view`; "
     "docs/device-view.md)"},
    // The tests' and the scripts' own.
    {"SOFTRDMA_BIN", Type::Path, "<repo>/build/bin", "tests, bench", "`<build>/bin` of the build under test (ctest sets it)"},
    {"SOFTRDMA_LIB", Type::Path, "$SOFTRDMA_BIN/../lib", "tests/compat",
     "`<build>/lib` for compat.loader and compat.stubs (ctest sets it)"},
    {"SOFTRDMA_BUILD", Type::Path, "<repo>/build", "tools/demo.sh", "the build the demo runs"},
    {"SOFTRDMA_SKIP_ASAN", Type::Bool, "0", "tools/test.sh", "`1`: skip the sanitizer build"},
    {"SOFTRDMA_LOADER_TIMEOUT", Type::Uint, "5", "tests/compat/loader_test.sh",
     "seconds each binary may take to load"},
    {"SOFTRDMA_ATTACK_SCALE", Type::Uint, "1", "tests/hostile",
     "multiplies the number of injections of the wire attack tests"},
    {"SOFTRDMA_ATTACK", Type::Text, "", "tests/hostile", "internal: the command a registry attack child runs"},
    {"SOFTRDMA_WIRE_ATTACK_ALONE", Type::Flag, "", "tests/hostile",
     "internal: the wire attack test already runs in its own network namespace"},
};

// The value, or nullptr when unset or empty (both mean the default).
const char* value(const Lookup& lookup, const char* name) {
  const char* v = lookup(name);
  return v && *v ? v : nullptr;
}

bool bool_value(const Lookup& lookup, const char* name, bool fallback) {
  const char* v = value(lookup, name);
  if (v && std::strcmp(v, "0") == 0) return false;
  if (v && std::strcmp(v, "1") == 0) return true;
  return fallback;
}

// The default of a Uint or Bool row, from the table: one definition.
uint64_t table_default(const char* name) { return std::strtoull(find(name)->fallback, nullptr, 10); }

uint64_t uint_value(const Lookup& lookup, const char* name) {
  const char* v = value(lookup, name);
  return v ? std::strtoull(v, nullptr, 10) : table_default(name);
}

std::string text_value(const Lookup& lookup, const char* name) {
  const char* v = value(lookup, name);
  return v ? v : "";
}

std::optional<uint32_t> octal_value(const char* v) {
  if (!v) return std::nullopt;
  char* end = nullptr;
  unsigned long m = std::strtoul(v, &end, 8);
  if (*end != '\0' || m > 0777) return std::nullopt;
  return static_cast<uint32_t>(m);
}

Transport transport_value(const char* v) {
  if (v && std::strcmp(v, "iwarp") == 0) return Transport::Iwarp;
  if (v && std::strcmp(v, "both") == 0) return Transport::Both;
  return Transport::Roce;  // also for anything unknown
}

DirectPeers peers_value(const char* v) {
  if (v && std::strcmp(v, "any") == 0) return DirectPeers::Any;
  if (v && std::strcmp(v, "group") == 0) return DirectPeers::Group;
  return DirectPeers::User;  // also for anything unknown: the safe choice
}

bool all_digits(std::string_view v, char last) {
  for (char c : v)
    if (c < '0' || c > last) return false;
  return !v.empty();
}

bool is_choice(const char* choices, std::string_view v) {
  std::string_view rest = choices ? choices : "";
  while (!rest.empty()) {
    const size_t end = rest.find(' ');
    if (rest.substr(0, end) == v) return true;
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
  return false;
}

// The process's options (set_option), and their lock: parse() reads them on any thread. Never
// freed: exit-time code (a CM's farewell, a context closed by an atexit handler) still parses. A
// process that never sets one never takes the lock (a child forked while another thread parsed
// could not take it again).
std::atomic<bool> any_options{false};
std::mutex& options_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<std::string, std::string, std::less<>>& options() {
  static auto* o = new std::map<std::string, std::string, std::less<>>;
  return *o;
}

// A name's value: `first`'s, else the process's option, else the environment's. The caller holds
// options_mutex() if `opts`.
const char* process_value(const Assignments& first, bool opts, const char* name) {
  for (auto it = first.rbegin(); it != first.rend(); ++it)  // the last of a name wins
    if (it->first == name) return it->second.c_str();
  if (opts) {
    const auto& o = options();
    if (auto it = o.find(std::string_view(name)); it != o.end()) return it->second.c_str();
  }
  return std::getenv(name);
}

}  // namespace

const char* type_name(Type t) {
  switch (t) {
    case Type::Bool: return "bool";
    case Type::Flag: return "flag";
    case Type::Uint: return "uint";
    case Type::Octal: return "octal";
    case Type::Choice: return "choice";
    case Type::Text: return "text";
    case Type::Path: return "path";
  }
  return "?";
}

std::span<const Variable> table() { return kTable; }

const Variable* find(std::string_view name) {
  for (const Variable& v : kTable)
    if (name == v.name) return &v;
  return nullptr;
}

bool accepts(const Variable& v, std::string_view value) {
  if (value.empty()) return true;
  switch (v.type) {
    case Type::Bool: return value == "0" || value == "1";
    case Type::Uint: {
      if (!all_digits(value, '9')) return false;
      const std::string s(value);
      errno = 0;
      std::strtoull(s.c_str(), nullptr, 10);
      return errno != ERANGE;
    }
    case Type::Octal: return all_digits(value, '7') && octal_value(std::string(value).c_str()).has_value();
    case Type::Choice: return is_choice(v.choices, value);
    case Type::Flag:
    case Type::Text:
    case Type::Path: return true;
  }
  return false;
}

std::optional<Assignments> parse_assignments(std::string_view text) {
  Assignments out;
  while (!text.empty()) {
    const size_t end = text.find(';');
    const std::string_view item = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const Variable* v = find(item.substr(0, eq));
    const std::string_view value = item.substr(eq + 1);
    if (!v || !accepts(*v, value)) return std::nullopt;
    out.emplace_back(v->name, value);
  }
  return out;
}

bool set_option(std::string_view name, const char* value) {
  const Variable* v = find(name);
  if (!v || (value && !accepts(*v, value))) return false;
  std::lock_guard lock(options_mutex());
  if (value)
    options()[v->name] = value;
  else
    options().erase(v->name);
  any_options.store(true);
  return true;
}

Settings parse(const Lookup& lookup) {
  Settings s;
  s.transport = transport_value(value(lookup, "SOFTRDMA_TRANSPORT"));
  s.impair = text_value(lookup, "SOFTRDMA_IMPAIR");
  // Packet faults are asked of packets: an impaired context runs without the direct path, on every
  // transport (the engine, and iWARP's connection setup in librdmacm and libibverbs).
  s.direct = bool_value(lookup, "SOFTRDMA_DIRECT", s.impair.empty());
  s.direct_peers = peers_value(value(lookup, "SOFTRDMA_DIRECT_PEERS"));
  s.spin_us = uint_value(lookup, "SOFTRDMA_SPIN_US");
  s.peer_pause_ms = uint_value(lookup, "SOFTRDMA_PEER_PAUSE_MS");
  s.gso = bool_value(lookup, "SOFTRDMA_GSO", table_default("SOFTRDMA_GSO") != 0);
  s.capture = text_value(lookup, "SOFTRDMA_CAPTURE");
  s.counters = value(lookup, "SOFTRDMA_COUNTERS") != nullptr;
  s.stats_mode = octal_value(value(lookup, "SOFTRDMA_STATS_MODE"));
  s.registry = text_value(lookup, "SOFTRDMA_REGISTRY");
  s.tuples = text_value(lookup, "SOFTRDMA_TUPLES");
  s.wire_protect = text_value(lookup, "SOFTRDMA_WIRE_PROTECT");
  s.auth_key = text_value(lookup, "SOFTRDMA_AUTH_KEY");
  s.auth_key_file = text_value(lookup, "SOFTRDMA_AUTH_KEY_FILE");
  s.cm_timeout_ms = uint_value(lookup, "SOFTRDMA_CM_TIMEOUT_MS");
  s.cm_retries = uint_value(lookup, "SOFTRDMA_CM_RETRIES");
  s.cm_probe_ms = uint_value(lookup, "SOFTRDMA_CM_PROBE_MS");
  if (const char* v = value(lookup, "SOFTRDMA_MPA_TIMEOUT_MS")) s.mpa_timeout_ms = std::strtoull(v, nullptr, 10);
  s.mpa_crc = bool_value(lookup, "SOFTRDMA_MPA_CRC", table_default("SOFTRDMA_MPA_CRC") != 0);
  s.lib_dir = text_value(lookup, "SOFTRDMA_LIB_DIR");
  s.view = bool_value(lookup, "SOFTRDMA_VIEW", table_default("SOFTRDMA_VIEW") != 0);
  return s;
}

Settings parse() { return parse(Assignments{}); }

Settings parse(const Assignments& first) {
  if (!any_options.load()) return parse([&first](const char* name) { return process_value(first, false, name); });
  std::lock_guard lock(options_mutex());
  return parse([&first](const char* name) { return process_value(first, true, name); });
}

}  // namespace softrdma::config
