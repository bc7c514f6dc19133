// Placing a remote WRITE's bytes into registered memory the way a NIC's DMA does: each byte stored
// once, the last bytes last. Programs that poll the last byte of a buffer for a peer's WRITE (perftest's
// write_lat, riostream, rsockets' iomap users) take the buffer as theirs once that byte changes, and
// may write it at once. A library memcpy may store the same bytes twice (glibc's AVX-512 copy of exactly
// 64 bytes stores its one vector as both the first and the last) and stores the head of a long copy
// after its tail; either undoes such a program's own write.
#pragma once
#include <cstdint>

namespace softrdma::core {

// Copies n bytes from src to dst: all but the last kOrderedTail by memcpy, then, after a fence, the
// tail in ascending 16/8/4/2/1-byte stores, each byte once.
void place_in_order(uint8_t* dst, const uint8_t* src, uint64_t n);

inline constexpr uint64_t kOrderedTail = 64;

}  // namespace softrdma::core
