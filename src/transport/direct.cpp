// Whether a context serves and uses the intra-host direct path (direct.h); DirectEndpoint itself only
// puts its parts together (direct.h lists them).
#include "transport/direct.h"

#include <cstdlib>
#include <cstring>

namespace softrdma::transport {

// On unless SOFTRDMA_DIRECT=0 (for comparison) or SOFTRDMA_IMPAIR asks for packet faults.
constexpr bool kDirectByDefault = true;

bool direct_enabled() {
  // Read per context (at its creation): a process may open impaired and unimpaired contexts.
  if (const char* s = getenv("SOFTRDMA_DIRECT")) return strcmp(s, "0") != 0;
  return kDirectByDefault && getenv("SOFTRDMA_IMPAIR") == nullptr;
}

}  // namespace softrdma::transport
