/* control.c: two functions for krex's own Python side (the controller wakes a gate's waiters, a warm worker
 * asks for its parent-death signal), loaded through cffi (krex_ctl/wire/native.py) so that no syscall number
 * or prctl option is spelled in Python. The shim itself never calls them. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "shim.h"

/* wake every thread sleeping on a gate word (gate.c waits with FUTEX_WAIT on the shared page) */
KREX_EXPORT long krex_gate_wake(uint32_t *word) {
    return syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* PR_SET_PDEATHSIG for the calling thread's process: 0, or -1 with errno */
KREX_EXPORT int krex_parent_death_signal(int sig) { return prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0); }
