// MPA, DDP and RDMAP encoding and parsing (wire/iwarp.h; RFC 5044, 6581, 5041, 5040).
#include "wire/iwarp.h"
