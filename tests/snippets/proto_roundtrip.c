/* proto_roundtrip.c: the C side of the message round-trip test. `encode` writes one frame of each
 * shim-sent message type to stdout (fixed values); `decode` reads frames from stdin and prints each
 * frame's type and fields, so Python-encoded messages are checked by the C definitions. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "../../shim/krex_wire.h"

static void frame(int type, const void *p, uint32_t len) {
    struct krex_frame_hdr h = {KREX_MAGIC, (uint16_t)type, 0, len, 7};
    fwrite(&h, sizeof h, 1, stdout);
    fwrite(p, len, 1, stdout);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "encode")) {
        struct krex_hello hello = {KREX_MAGIC, KREX_PROTO_VERSION, KREX_ROLE_SHIM, 42, 4242, KREX_HELLO_RECONNECT};
        struct krex_context ctx = {KREX_VENDOR_HIP, 3, KREX_CONTEXT_HAS_UUID, 1, {0x6b, 0x72, 0x65, 0x78}, 31337};
        struct krex_region_begin b = {0x5, 123456789, "matmul", 0x2};
        struct krex_region_end e = {77, 987654321, 12, KREX_END_KERNELS_COUNTED, 24680};
        struct krex_beside bs = {78, 3, 0, 4321};
        struct krex_drained d = {9, -3, 250, 1ull << 33, 55, 1200, 0};
        struct krex_region_cancel c = {12, 0};
        struct krex_lifecycle l = {KREX_LIFE_EXIT_BEGIN, -1, 1ull << 30, 99};
        frame(KREX_MSG_HELLO, &hello, sizeof hello);
        frame(KREX_MSG_CONTEXT, &ctx, sizeof ctx);
        frame(KREX_MSG_REGION_BEGIN, &b, sizeof b);
        frame(KREX_MSG_REGION_END, &e, sizeof e);
        frame(KREX_MSG_DRAINED, &d, sizeof d);
        frame(KREX_MSG_REGION_CANCEL, &c, sizeof c);
        frame(KREX_MSG_LIFECYCLE, &l, sizeof l);
        frame(KREX_MSG_BESIDE, &bs, sizeof bs);
        return 0;
    }
    struct krex_frame_hdr h;
    char buf[KREX_MAX_PAYLOAD];
    while (fread(&h, sizeof h, 1, stdin) == 1) {
        if (h.magic != KREX_MAGIC || h.length > sizeof buf || fread(buf, 1, h.length, stdin) != h.length) return 1;
        switch (h.type) {
        case KREX_MSG_WELCOME: {
            struct krex_welcome *w = (void *)buf;
            printf("WELCOME %u %u %u %d %u %u %u %u %u\n", w->magic, w->version, w->client_id, w->job, w->max_gpus,
                   w->gate_stride, w->gate_offset, w->has_gate_fd, w->controller_pid);
            break;
        }
        case KREX_MSG_ERROR: {
            struct krex_error *er = (void *)buf;
            printf("ERROR %d %s\n", er->code, er->text);
            break;
        }
        case KREX_MSG_REGION_GRANTED: {
            struct krex_region_granted *g = (void *)buf;
            printf("GRANTED %llu %llu %lld %lld %u %u %lld %u %u\n", (unsigned long long)g->region_id,
                   (unsigned long long)g->gpu_mask, (long long)g->requested_ns, (long long)g->granted_ns, g->frozen,
                   g->drain_timeouts, (long long)g->time_limit_ns, g->flags, g->members);
            break;
        }
        case KREX_MSG_REGION_ENDED: {
            struct krex_region_ended *x = (void *)buf;
            printf("ENDED %llu %lld %u %u %u %u %u\n", (unsigned long long)x->region_id, (long long)x->ended_ns,
                   x->reason, x->flags, x->taints, x->sm_clock_min_mhz, x->sm_clock_max_mhz);
            break;
        }
        case KREX_MSG_DRAIN: {
            struct krex_drain *x = (void *)buf;
            printf("DRAIN %llu %llu\n", (unsigned long long)x->drain_id, (unsigned long long)x->gpu_mask);
            break;
        }
        default: printf("TYPE %u\n", h.type);
        }
    }
    return 0;
}
