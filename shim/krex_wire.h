/* krex_wire.h: C entry to the wire format; the guard and <stdint.h> stay out of krex_proto.h for cffi. */
#ifndef KREX_WIRE_H
#define KREX_WIRE_H
#include <stdint.h>
#include "krex_proto.h"

_Static_assert(sizeof(struct krex_frame_hdr) == 16, "frame header size");
_Static_assert(sizeof(struct krex_gate_page_hdr) == 64, "gate page header size");
_Static_assert(sizeof(struct krex_gate) == 64, "gate slot is one cache line");
_Static_assert(sizeof(struct krex_counters_hdr) == 64, "counters header size");
_Static_assert(sizeof(struct krex_counter_slot) == 256, "counter slot is four cache lines");
_Static_assert(sizeof(struct krex_local_region) == 144, "local region record size");

#define KREX_GATE_PAGE_BYTES (sizeof(struct krex_gate_page_hdr) + KREX_MAX_GPUS * sizeof(struct krex_gate))
#define KREX_COUNTERS_BYTES (sizeof(struct krex_counters_hdr) + KREX_COUNTER_SLOTS * sizeof(struct krex_counter_slot) + \
                             KREX_LOCAL_REGIONS * sizeof(struct krex_local_region))
#endif
