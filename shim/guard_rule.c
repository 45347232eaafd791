/* guard_rule.c: the overlap guard's schedule and decision rule (guard_rule.h). Pure: no driver, no state, no
 * libc beyond what a test program links anyway. */
#include "guard_rule.h"

int krex_guard_schedule(int pos, int a, int *sample) {
    const int m = KREX_GUARD_M;
    *sample = -1;
    if (pos < 0 || pos >= KREX_GUARD_EXPLORE) return KREX_GUARD_EXPLOIT;
    if (pos == 0) return a;
    if (pos <= m) return *sample = pos - 1, a;                           /* A1 */
    if (pos == m + 1) return !a;
    if (pos <= 3 * m + 1) return *sample = pos - (m + 2), !a;            /* B */
    if (pos == 3 * m + 2) return a;
    return *sample = m + pos - (3 * m + 3), a;                           /* A2 */
}

static void sorted(const float *v, int n, float *out) {
    for (int i = 0; i < n; i++) {
        int j = i;
        for (; j > 0 && out[j - 1] > v[i]; j--) out[j] = out[j - 1];
        out[j] = v[i];
    }
}

double krex_guard_median(const float *v, int n) {
    float s[KREX_GUARD_SAMPLES];
    if (n <= 0 || n > KREX_GUARD_SAMPLES) return 0;
    sorted(v, n, s);
    return n % 2 ? s[n / 2] : ((double)s[n / 2 - 1] + s[n / 2]) / 2;
}

/* the gap between the middle samples over the median: the arm's own spread, robust to one outlier */
static double spread(const float *v, int n) {
    float s[KREX_GUARD_SAMPLES];
    sorted(v, n, s);
    double med = krex_guard_median(v, n);
    int q = n / 4;
    return med > 0 ? ((double)s[n - 1 - q] - s[q]) / med : 1;
}

int krex_guard_choose(const float *off, const float *on, double *margin) {
    const int n = KREX_GUARD_SAMPLES;
    double m = KREX_GUARD_MIN_MARGIN;
    if (margin) *margin = m;
    for (int i = 0; i < n; i++)
        if (!(off[i] > 0) || !(on[i] > 0)) return 0;                    /* a lost or unread sample: off */
    double s_off = spread(off, n), s_on = spread(on, n);
    if (s_off > m) m = s_off;
    if (s_on > m) m = s_on;
    if (margin) *margin = m;
    return krex_guard_median(on, n) < krex_guard_median(off, n) * (1 - m);
}
