// place_in_order (place.h): a library memcpy for the bulk, single ascending stores for the tail.
#include "core/place.h"

#include <atomic>
#include <cstring>

namespace softrdma::core {
namespace {

// Unaligned, as the bytes are (UBSan checks these against their declared alignment of 1); volatile, so
// the compiler emits each store once and in program order instead of merging them into a memcpy.
template <typename T>
using Unaligned __attribute__((aligned(1), may_alias)) = T;

// 16 bytes in one store (an SSE or NEON register): four of them place a 64-byte tail.
typedef uint8_t Bytes16 __attribute__((vector_size(16)));

template <typename T>
void store_once(uint8_t* dst, const uint8_t* src) {
  T v;
  std::memcpy(&v, src, sizeof v);
  *reinterpret_cast<volatile Unaligned<T>*>(dst) = v;
}

}  // namespace

void place_in_order(uint8_t* dst, const uint8_t* src, uint64_t n) {
  if (n > kOrderedTail) {
    const uint64_t bulk = n - kOrderedTail;
    std::memcpy(dst, src, bulk);
    // The bulk's stores before the tail's: on x86 stores stay in order (memcpy's non-temporal stores end
    // with its own sfence, string stores are ordered before later stores), so this only keeps the
    // compiler from moving them; weaker CPUs get their barrier.
    std::atomic_thread_fence(std::memory_order_release);
    dst += bulk;
    src += bulk;
    n = kOrderedTail;
  }
  for (; n >= 16; n -= 16, dst += 16, src += 16) store_once<Bytes16>(dst, src);
  if (n & 8) {
    store_once<uint64_t>(dst, src);
    dst += 8;
    src += 8;
  }
  if (n & 4) {
    store_once<uint32_t>(dst, src);
    dst += 4;
    src += 4;
  }
  if (n & 2) {
    store_once<uint16_t>(dst, src);
    dst += 2;
    src += 2;
  }
  if (n & 1) store_once<uint8_t>(dst, src);
}

}  // namespace softrdma::core
