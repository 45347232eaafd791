"""Every protocol struct has the same size and field offsets in C as cffi reads from krex_proto.h,
and messages encoded on one side decode on the other."""

import ctypes
import os
import re
import subprocess

from conftest import BUILD, ROOT, SNIP
from krex_ctl.wire import client, frames
from krex_ctl.wire.frames import C, MSG, ffi


def test_c_and_cffi_agree_on_every_struct(tmp_path):
    lines = ['#include <stdio.h>', '#include <stddef.h>', f'#include "{ROOT}/shim/krex_wire.h"', "int main(void) {"]
    expect = []
    for name in frames.struct_names():
        t = f"struct {name}"
        lines.append(f'printf("{name} %zu\\n", sizeof({t}));')
        expect.append(f"{name} {ffi.sizeof(t)}")
        for field, _ in ffi.typeof(t).fields:
            lines.append(f'printf("{name}.{field} %zu\\n", offsetof({t}, {field}));')
            expect.append(f"{name}.{field} {ffi.offsetof(t, field)}")
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", tmp_path / "layout", src], check=True)
    got = subprocess.run([tmp_path / "layout"], capture_output=True, text=True, check=True).stdout.split("\n")
    assert [g for g in got if g] == expect
    assert len(frames.struct_names()) >= 14


def each_frame(data: bytes):
    while data:
        mtype, length, seq = frames.unpack_header(data)
        yield mtype, data[frames.HDR_SIZE:frames.HDR_SIZE + length], seq
        data = data[frames.HDR_SIZE + length:]


def test_c_encoded_messages_decode_in_python():
    data = subprocess.run([SNIP / "proto_roundtrip", "encode"], capture_output=True, check=True).stdout
    got = {frames.MESSAGES[t][0]: (p, s) for t, p, s in each_frame(data)}
    hello = frames.decode("struct krex_hello", got["HELLO"][0])
    assert (hello.magic, hello.version, hello.role, hello.job, hello.job_root, hello.flags) == \
        (frames.MAGIC, frames.VERSION, C.KREX_ROLE_SHIM, 42, 4242, C.KREX_HELLO_RECONNECT)
    ctx = frames.decode("struct krex_context", got["CONTEXT"][0])
    assert (ctx.vendor, ctx.device, ctx.flags, ctx.local_device) == (C.KREX_VENDOR_HIP, 3, C.KREX_CONTEXT_HAS_UUID, 1)
    assert bytes(frames.ffi.buffer(ctx.uuid)) == b"krex" + bytes(12) and ctx.announced_ns == 31337
    b = frames.decode("struct krex_region_begin", got["REGION_BEGIN"][0])
    assert (b.gpu_mask, b.requested_ns, frames.cstr(b.name), b.fallback_mask) == (5, 123456789, "matmul", 2)
    e = frames.decode("struct krex_region_end", got["REGION_END"][0])
    assert (e.region_id, e.ended_ns, e.kernels, e.flags, e.quiet_ns) == (77, 987654321, 12, C.KREX_END_KERNELS_COUNTED,
                                                                        24680)
    bs = frames.decode("struct krex_beside", got["BESIDE"][0])
    assert (bs.region_id, bs.device, bs.t_ns) == (78, 3, 4321)
    d = frames.decode("struct krex_drained", got["DRAINED"][0])
    assert (d.drain_id, d.status, d.waited_us, d.freed_bytes, d.last_free_ns, d.sync_us) == (9, -3, 250, 1 << 33, 55, 1200)
    c = frames.decode("struct krex_region_cancel", got["REGION_CANCEL"][0])
    assert c.request_seq == 12
    lc = frames.decode("struct krex_lifecycle", got["LIFECYCLE"][0])
    assert (lc.event, lc.device, lc.bytes, lc.t_ns) == (C.KREX_LIFE_EXIT_BEGIN, -1, 1 << 30, 99)
    assert all(seq == 7 for _, seq in got.values())


def test_python_encoded_messages_decode_in_c():
    data = b"".join([
        frames.pack(MSG["WELCOME"], frames.encode("struct krex_welcome", magic=frames.MAGIC, version=frames.VERSION,
                                                client_id=3, job=4, max_gpus=64, gate_stride=64, gate_offset=64,
                                                has_gate_fd=1, controller_pid=77)),
        frames.pack(MSG["ERROR"], frames.error_payload(C.KREX_ERR_VERSION, "versions differ")),
        frames.pack(MSG["REGION_GRANTED"], frames.encode("struct krex_region_granted", region_id=11, gpu_mask=2,
                                                       requested_ns=100, granted_ns=200, frozen=3, drain_timeouts=1,
                                                       time_limit_ns=5, flags=C.KREX_REGION_GRANTED, members=2)),
        frames.pack(MSG["REGION_ENDED"], frames.encode("struct krex_region_ended", region_id=11, ended_ns=300,
                                                     reason=C.KREX_END_TIME_LIMIT, flags=6, taints=16,
                                                     sm_clock_min_mhz=1400, sm_clock_max_mhz=1980)),
        frames.pack(MSG["DRAIN"], frames.encode("struct krex_drain", drain_id=12, gpu_mask=1)),
    ])
    out = subprocess.run([SNIP / "proto_roundtrip", "decode"], input=data, capture_output=True, check=True).stdout
    assert out.decode().splitlines() == [
        f"WELCOME {frames.MAGIC} {frames.VERSION} 3 4 64 64 64 1 77",
        f"ERROR {C.KREX_ERR_VERSION} versions differ",
        f"GRANTED 11 2 100 200 3 1 5 {C.KREX_REGION_GRANTED} 2",
        f"ENDED 11 300 {C.KREX_END_TIME_LIMIT} 6 16 1400 1980",
        "DRAIN 12 1",
    ]
    assert BUILD.exists()


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(mtype=st.integers(0, 0xFFFF), payload=st.binary(max_size=300), seq=st.integers(0, 2**32 - 1))
def test_framing_round_trips(mtype, payload, seq):
    frame = frames.pack(mtype, payload, seq)
    assert frames.unpack_header(frame) == (mtype, len(payload), seq)
    assert frame[frames.HDR_SIZE:] == payload


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=16, max_size=16))
def test_bad_headers_are_rejected_not_crashed(data):
    try:
        mtype, length, _ = frames.unpack_header(data)
    except frames.ProtocolError:
        return
    assert length <= frames.MAX_PAYLOAD and data[:4] == frames.MAGIC.to_bytes(4, "little")


def test_region_info_struct_of_the_python_api_is_the_shims(tmp_path):
    """krex.last_region reads struct krex_region_info (shim/krex.h) through the cffi declaration of
    krex_ctl/wire/native.py: the same size and offsets as the C compiler gives them."""
    from krex_ctl.wire import native  # noqa: F401  (declares the struct)

    fields = [f for f, _ in ffi.typeof("struct krex_region_info").fields]
    lines = ['#include <stdio.h>', '#include <stddef.h>', f'#include "{ROOT}/shim/krex.h"', "int main(void) {",
             'printf("size %zu\\n", sizeof(struct krex_region_info));']
    lines += [f'printf("{f} %zu\\n", offsetof(struct krex_region_info, {f}));' for f in fields]
    lines.append("return 0; }")
    src = tmp_path / "info.c"
    src.write_text("\n".join(lines))
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", tmp_path / "info", src], check=True)
    got = subprocess.run([tmp_path / "info"], capture_output=True, text=True, check=True).stdout.split()
    expect = ["size", str(ffi.sizeof("struct krex_region_info"))]
    for f in fields:
        expect += [f, str(ffi.offsetof("struct krex_region_info", f))]
    assert got == expect


def test_taint_names_come_from_the_header_enum():
    """A taint is one enum line in krex_proto.h: its name is that line's, in snake case, everywhere."""
    text = (ROOT / "shim" / "krex_proto.h").read_text()
    declared = re.findall(r"^\s+KREX_TAINT_(\w+) = (\d+)", text, flags=re.M)
    assert {int(v): n.lower() for n, v in declared} == frames.TAINT_NAMES
    assert frames.NOT_EXCLUSIVE == (C.KREX_TAINT_NOT_GRANTED | C.KREX_TAINT_CONTROLLER_LOST | C.KREX_TAINT_REVOKED
                                    | C.KREX_TAINT_DRAIN_TIMEOUT | C.KREX_TAINT_FOREIGN_PROCESS
                                    | C.KREX_TAINT_UNREGISTERED | C.KREX_TAINT_OTHER_CONTROLLER
                                    | C.KREX_TAINT_LATE_CONTEXT | C.KREX_TAINT_UNGATED_GPU | C.KREX_TAINT_SHARED_GPU)


def test_the_compiled_declarations_are_the_parsed_ones_and_a_stale_module_is_not_used(tmp_path):
    """build/krex_ffi.py (wire/cdefs.py, written by `make shim`) is what frames.py loads: every struct's layout,
    every enum and #define the same as cffi's parse of the header gives; a module made from another header
    (its SOURCE differs) is passed over for a parse, and so is one that does not load."""
    from krex_ctl import paths
    from krex_ctl.wire import cdefs

    header = paths.proto_header().read_text()
    assert paths.compiled_ffi().is_file(), "make shim writes it"
    compiled, parsed = cdefs.load(header, paths.compiled_ffi()), cdefs.parse(header)
    assert type(compiled) is not type(parsed)            # the out-of-line module's FFI, not a parse
    assert type(ffi) is type(compiled)                  # and frames.py's FFI is one of those
    for name in frames.struct_names() + ["krex_region_info"]:
        t = f"struct {name}"
        assert compiled.sizeof(t) == parsed.sizeof(t), t
        assert [(f, compiled.offsetof(t, f)) for f, _ in compiled.typeof(t).fields] == \
            [(f, parsed.offsetof(t, f)) for f, _ in parsed.typeof(t).fields], t
    for enum in re.findall(r"^enum (\w+) \{", header, flags=re.M):
        assert compiled.typeof(f"enum {enum}").elements == parsed.typeof(f"enum {enum}").elements, enum
    defines = re.findall(r"^#define (KREX_\w+) +\(?-?(?:0x)?[0-9A-Fa-f]+u?\)?\s*(?:/[/*].*)?$", header, flags=re.M)
    assert len(defines) >= 5
    cl, pl = compiled.dlopen(None), parsed.dlopen(None)
    assert all(getattr(cl, d) == getattr(pl, d) for d in defines)
    assert "krex_region_wait" in dir(compiled.dlopen(str(paths.shim_library())))

    other = tmp_path / "krex_ffi.py"                     # made from another header: not used
    cdefs.build(header + "\nstruct krex_not_in_the_header { int x; };\n", other)
    assert type(cdefs.load(header, other)) is type(parsed)
    assert type(cdefs.load(header + "\nstruct krex_not_in_the_header { int x; };\n", other)) is type(compiled)
    other.write_text("raise RuntimeError('broken')\n")   # one that does not load: parsed instead
    assert type(cdefs.load(header, other)) is type(parsed)
    assert type(cdefs.load(header, tmp_path / "missing.py")) is type(parsed)


def test_a_symbol_the_process_lacks_is_told_apart_with_either_ffi(tmp_path):
    """native.lib() finds out whether the shim is preloaded by looking its symbol up in the process: a parsed
    FFI's library raises AttributeError there, a compiled one's ffi.error (cdefs.missing_symbol takes both). With
    the declarations parsed at import (no compiled module), a process without the shim gets the packaged
    libkrex.so and can wake a gate word, as the controller does at every region's end."""
    import subprocess
    import sys

    from krex_ctl import paths
    from krex_ctl.wire import cdefs

    header = paths.proto_header().read_text()
    for f in (cdefs.parse(header), cdefs.load(header, paths.compiled_ffi())):
        try:
            f.dlopen(None).krex_shim_loaded
        except cdefs.missing_symbol():
            pass
        else:
            raise AssertionError(f"{type(f)}: the shim's symbol found in a process without it")
    code = ("from pathlib import Path\nfrom krex_ctl import paths\n"
            "paths.compiled_ffi = lambda: Path('/nonexistent/krex_ffi.py')\n"
            "from krex_ctl.wire import frames, native\n"
            "assert 'cffi.api' in type(frames.ffi).__module__, type(frames.ffi)\n"
            "assert native.lib() is not None and native.preloaded() is False\n"
            "word = frames.ffi.new('uint32_t *')\n"
            "native.gate_wake(word)\n"
            "import krex._region as r\n"
            "print('ok', r._last_timings(native.lib()))\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("ok (0, 0)"), p.stderr
