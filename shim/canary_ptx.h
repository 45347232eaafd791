/* krex_spin(out, ns): the canary and warm-up kernel the shim loads (cuModuleLoadData JITs it for the GPU
 * at hand; PTX ISA 6.0 for sm_50 and later). Every thread spins until ns nanoseconds of %globaltimer have
 * passed; thread 0 of block b then writes three u64 at out + 24 b: the globaltimer at its start, the ns it
 * spun and the %clock64 ticks meanwhile (ticks / ns = the SM clock in GHz while it ran). bench/region_start.py
 * reads this string from here and runs it on the GPU. */
#ifndef KREX_CANARY_PTX_H
#define KREX_CANARY_PTX_H

static const char KREX_CANARY_PTX[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry krex_spin(.param .u64 krex_spin_out, .param .u64 krex_spin_ns)\n"
    "{\n"
    "  .reg .pred %p<3>;\n"
    "  .reg .b32 %r<3>;\n"
    "  .reg .b64 %rd<12>;\n"
    "  ld.param.u64 %rd1, [krex_spin_out];\n"
    "  ld.param.u64 %rd2, [krex_spin_ns];\n"
    "  mov.u64 %rd3, %globaltimer;\n"
    "  mov.u64 %rd4, %clock64;\n"
    "$L_spin:\n"
    "  mov.u64 %rd5, %globaltimer;\n"
    "  sub.u64 %rd6, %rd5, %rd3;\n"
    "  setp.lt.u64 %p1, %rd6, %rd2;\n"
    "  @%p1 bra $L_spin;\n"
    "  mov.u64 %rd7, %clock64;\n"
    "  mov.u32 %r1, %tid.x;\n"
    "  setp.ne.u32 %p2, %r1, 0;\n"
    "  @%p2 bra $L_done;\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  cvta.to.global.u64 %rd8, %rd1;\n"
    "  mul.wide.u32 %rd9, %r2, 24;\n"
    "  add.u64 %rd10, %rd8, %rd9;\n"
    "  sub.u64 %rd11, %rd7, %rd4;\n"
    "  st.global.u64 [%rd10], %rd3;\n"
    "  st.global.u64 [%rd10+8], %rd6;\n"
    "  st.global.u64 [%rd10+16], %rd11;\n"
    "$L_done:\n"
    "  ret;\n"
    "}\n";

#endif
