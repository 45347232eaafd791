/* guard_rule.c: the overlap guard's schedule and decision rule (shim/guard_rule.c), alone, for tests.
 *   guard_rule schedule A            one line: the arm of each position of a cycle that starts with arm A (0/1):
 *                                    `0`/`1` measured, `o`/`i` run off/on but not measured, `x` exploits
 *   guard_rule choose OFF... ON...   two comma lists of KREX_GUARD_SAMPLES epoch times (ms): prints `on` or
 *                                    `off` and the margin used, as a fraction
 *   guard_rule constants             `period P explore X samples S min_margin M` */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "guard_rule.h"

static int list(const char *text, float *out) {
    int n = 0;
    for (const char *p = text; *p && n < KREX_GUARD_SAMPLES;) {
        char *end;
        out[n++] = strtof(p, &end);
        if (end == p) return -1;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "schedule")) {
        for (int pos = 0; pos < KREX_GUARD_PERIOD; pos++) {
            int s, arm = krex_guard_schedule(pos, atoi(argv[2]), &s);
            putchar(arm == KREX_GUARD_EXPLOIT ? 'x' : s >= 0 ? '0' + arm : arm ? 'i' : 'o');
        }
        putchar('\n');
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "choose")) {
        float off[KREX_GUARD_SAMPLES], on[KREX_GUARD_SAMPLES];
        if (list(argv[2], off) != KREX_GUARD_SAMPLES || list(argv[3], on) != KREX_GUARD_SAMPLES) {
            fprintf(stderr, "want %d samples each\n", KREX_GUARD_SAMPLES);
            return 2;
        }
        double margin;
        int arm = krex_guard_choose(off, on, &margin);
        printf("%s %.4f\n", arm ? "on" : "off", margin);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "constants")) {
        printf("period %d explore %d samples %d min_margin %g\n", KREX_GUARD_PERIOD, KREX_GUARD_EXPLORE,
               KREX_GUARD_SAMPLES, KREX_GUARD_MIN_MARGIN);
        return 0;
    }
    fprintf(stderr, "usage: guard_rule schedule A | choose OFF,... ON,... | constants\n");
    return 2;
}
