// This process's device counters, read from its stats pages (core/stats.h) as `softrdma stat` reads
// them: for tests of any suite that check what softrdma counted.
#pragma once

#include <cstdint>

#include "core/stats.h"  // the stats page's counter layout (header only)

namespace softrdma::verbs_test {

// `field` summed over this process's device stats pages; 0 without any (another provider, $VT_DEVICE).
uint64_t my_counter(uint64_t core::Counters::*field);

}  // namespace softrdma::verbs_test
