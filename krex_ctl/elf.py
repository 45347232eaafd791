"""Whether an ELF shared object exports a symbol, read from the file: nothing of it is loaded or run (`krex run`
checks KREX_SHIM so, in its own process). Only what the dynamic linker would see counts: a defined, global or
weak symbol of the dynamic symbol table (.dynsym), in an ELF file of this interpreter's class, byte order and
machine. Why not a library: dlopen (ctypes, cffi) would run the shim's constructors in `krex run`'s own process
(it connects to the controller, installs its hooks), a child process to dlopen it would cost `krex run` a
second interpreter's start, and pyelftools would be a new dependency for this one lookup."""

import os
import stat
import struct
import sys
from typing import Optional

_MAGIC = b"\x7fELF"
_ET_DYN = 3
_SHT_DYNSYM = 11
_MAX_TABLE = 64 << 20          # a .dynsym or .dynstr larger than this is not a shim's: not read


def _own_header() -> bytes:
    try:
        with open(sys.executable, "rb") as f:
            return f.read(20)
    except OSError:
        return b""


def missing_export(path: str, name: str) -> Optional[str]:
    """None when the shared object at path exports `name`; else why not, in a few words ("not an ELF file",
    "does not export krex_shim_loaded", ...). Never raises for what the file holds; OSError when it cannot be
    opened or read."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 52 or head[:4] != _MAGIC:
            return "not an ELF file"
        cls, data = head[4], head[5]
        if cls not in (1, 2) or data not in (1, 2):
            return "not an ELF file"
        own = _own_header()
        if own[:4] == _MAGIC and (own[4], own[5]) != (cls, data):
            bits = lambda c: 32 if c == 1 else 64   # noqa: E731
            return f"a {bits(cls)}-bit ELF file; this machine's programs are {bits(own[4])}-bit"
        end = "<" if data == 1 else ">"
        try:
            if cls == 2:
                e_type, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, _ = struct.unpack_from(
                    end + "HHIQQQIHHHHHH", head, 16)
                sh_fmt, sym_fmt = end + "IIQQQQIIQQ", end + "IBBHQQ"
            else:
                e_type, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, _ = struct.unpack_from(
                    end + "HHIIIIIHHHHHH", head, 16)
                sh_fmt, sym_fmt = end + "IIIIIIIIII", end + "IIIBBH"
            if len(own) >= 20 and own[:4] == _MAGIC and struct.unpack_from(end + "H", own, 18)[0] != machine:
                return "an ELF file for another kind of processor"
            if e_type != _ET_DYN:
                return "not a shared library"
            if not shoff or shentsize < struct.calcsize(sh_fmt) or not 0 < shnum <= 65535:
                return "a shared library without section headers"

            def read(offset: int, size: int) -> bytes:
                if size > _MAX_TABLE:
                    raise ValueError("too large")
                f.seek(offset)
                out = f.read(size)
                if len(out) != size:
                    raise ValueError("cut off")
                return out

            table = read(shoff, shentsize * shnum)
            sections = [struct.unpack_from(sh_fmt, table, i * shentsize) for i in range(len(table) // shentsize)]

            def section(i: int) -> bytes:
                return read(*sections[i][4:6])

            for index, sh in enumerate(sections):
                if sh[1] != _SHT_DYNSYM or not 0 <= sh[6] < len(sections):
                    continue
                strings = section(sh[6])
                want = name.encode() + b"\0"
                offsets = set()
                at = strings.find(want)
                while at >= 0:
                    if at == 0 or strings[at - 1] == 0:
                        offsets.add(at)
                    at = strings.find(want, at + 1)
                if not offsets:
                    return f"does not export {name}"
                symbols = section(index)
                size = struct.calcsize(sym_fmt)
                for sym in struct.iter_unpack(sym_fmt, symbols[:len(symbols) - len(symbols) % size]):
                    st_name, info, shndx = (sym[0], sym[1], sym[3]) if cls == 2 else (sym[0], sym[3], sym[5])
                    if st_name in offsets and shndx != 0 and info >> 4 in (1, 2):   # defined; GLOBAL or WEAK
                        return None
                return f"does not export {name}"
            return "a shared library with no dynamic symbols"
        except (struct.error, ValueError, IndexError, OverflowError):
            return "not a well-formed ELF file"
