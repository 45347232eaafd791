/* guard_rule.h: the overlap guard's schedule and decision rule (guard_rule.c), pure functions of numbers: no
 * driver, no state. guard.c runs them on the epochs it times; tests/snippets/guard_rule.c drives them alone.
 *
 * A cycle is KREX_GUARD_PERIOD epochs. Its first KREX_GUARD_EXPLORE epochs explore in ABBA order, A the arm
 * the cycle starts with (the one exploited so far: off in the first cycle) and B the other:
 *   position 0           A   not measured (the first epoch of a program, or the first after a switch back)
 *   1 .. M               A   measured (A1)
 *   M + 1                B   not measured (the switch)
 *   M + 2 .. 3M + 1      B   measured (B, 2M epochs)
 *   3M + 2               A   not measured (the switch back)
 *   3M + 3 .. 4M + 2     A   measured (A2)
 * then exploits the arm chosen (A until the choice is known) to the cycle's end. Arm 1 is "the controls
 * on", 0 "off" (every launch as the caller made it). */
#ifndef KREX_GUARD_RULE_H
#define KREX_GUARD_RULE_H

#define KREX_GUARD_M 2                                /* measured epochs per letter of ABBA */
#define KREX_GUARD_SAMPLES (2 * KREX_GUARD_M)         /* measured epochs per arm and exploration */
#define KREX_GUARD_EXPLORE (4 * KREX_GUARD_M + 3)     /* 11: the epochs an exploration takes */
#define KREX_GUARD_PERIOD 128                         /* epochs from one exploration's start to the next */
#define KREX_GUARD_MIN_MARGIN 0.01                    /* ON must be at least this much faster than OFF */
#define KREX_GUARD_EXPLOIT (-1)                       /* krex_guard_schedule: the position exploits */

/* The arm of position pos (0 .. KREX_GUARD_PERIOD - 1) of a cycle that starts with arm a, or KREX_GUARD_EXPLOIT.
 * *sample: -1 when the position is not measured, else the index of its epoch among its arm's samples, in
 * time order (0 .. KREX_GUARD_SAMPLES - 1: A1 then A2 for arm a; B's first half then its second for the other). */
int krex_guard_schedule(int pos, int a, int *sample);

/* 1 (on) when the median of on[] is below the median of off[] by more than the margin, else 0 (off). Each
 * array holds KREX_GUARD_SAMPLES epoch times in time order, all > 0 (else 0: not enough to choose on). The
 * margin is KREX_GUARD_MIN_MARGIN or the samples' own spread if that is larger: for each arm, the gap between
 * its middle two samples (sorted) over its median; *margin (if not NULL) gets the margin used. */
int krex_guard_choose(const float *off, const float *on, double *margin);

/* the median of n samples (n <= KREX_GUARD_SAMPLES) */
double krex_guard_median(const float *v, int n);
#endif
