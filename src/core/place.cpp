// place_in_order (place.h): a library memcpy for the bulk, single ascending stores for the tail.
#include "core/place.h"

#include <atomic>
#include <cstring>

namespace softrdma::core {
namespace {

// The stores' types, unaligned as the bytes are: declared as emmintrin.h declares __m128i_u (element,
// vector_size, may_alias and aligned(1) in one list), the form GCC and clang both honour -- clang made
// an aligned store, which faults, of the earlier alias template. 16 bytes in one store (an SSE or NEON
// register; four place a 64-byte tail), then 8, 4, 2, 1.
typedef long long Bytes16 __attribute__((vector_size(16), may_alias, aligned(1)));
typedef uint64_t Bytes8 __attribute__((may_alias, aligned(1)));
typedef uint32_t Bytes4 __attribute__((may_alias, aligned(1)));
typedef uint16_t Bytes2 __attribute__((may_alias, aligned(1)));

// The type of an N-byte piece. A member typedef keeps its alignment; a type passed as a template
// argument would not (the store would be an aligned one again).
template <int N>
struct Piece;
template <>
struct Piece<16> {
  typedef Bytes16 type;
};
template <>
struct Piece<8> {
  typedef Bytes8 type;
};
template <>
struct Piece<4> {
  typedef Bytes4 type;
};
template <>
struct Piece<2> {
  typedef Bytes2 type;
};

// Volatile, so the compiler emits each store once and in program order instead of merging them into a
// memcpy.
template <int N>
void store(uint8_t* dst, const uint8_t* src) {
  typename Piece<N>::type v;
  std::memcpy(&v, src, N);
  *reinterpret_cast<volatile typename Piece<N>::type*>(dst) = v;
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
  for (; n >= 16; n -= 16, dst += 16, src += 16) store<16>(dst, src);
  if (n & 8) {
    store<8>(dst, src);
    dst += 8;
    src += 8;
  }
  if (n & 4) {
    store<4>(dst, src);
    dst += 4;
    src += 4;
  }
  if (n & 2) {
    store<2>(dst, src);
    dst += 2;
    src += 2;
  }
  if (n & 1) *reinterpret_cast<volatile uint8_t*>(dst) = *src;
}

}  // namespace softrdma::core
