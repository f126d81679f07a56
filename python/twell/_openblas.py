"""OpenBLAS's kernel set, chosen before twell loads Debian's OpenBLAS (docs/python.md, "Threads").

OpenBLAS picks its kernels by the CPU it recognises when it loads; a CPU its build does not know
(a newer model, or a virtual machine's generic "Intel Xeon Processor") gets its oldest x86-64 set,
Prescott (SSE3): twell's CPU GEMMs then run up to ~5x slower than the CPU allows (on an AVX-512
VM, bench/results/cpu/prescott/ against bench/results/cpu/: a 256 x 2048 x 5632 gate GEMM 191.7
against 39.8 ms, one row's 2.89 against 2.23 ms). Importing twell sets OPENBLAS_CORETYPE from the CPU's vector units where the
environment does not set it and no process-wide OpenBLAS is loaded yet (it reads the variable
once, when it loads): SkylakeX with AVX-512 (F, BW, VL, DQ, CD), else Zen (AMD) or Haswell with
AVX2 and FMA (twell::blas_core_for_cpu's rule, read here from /proc/cpuinfo because the library
is not loaded yet; a test checks they agree). twell.cpu_description() names the set in use; set OPENBLAS_CORETYPE to choose
another. Imported by twell/__init__.py before twell._core; imports nothing of twell.
"""
import os
import platform

_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}


def cpu_flags():
    """(vendor, the CPU's feature flags) from /proc/cpuinfo; ("", set()) where unreadable."""
    vendor, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return vendor, flags


def core_for(vendor, flags):
    """The OPENBLAS_CORETYPE for a CPU with these flags, or None (no AVX2: OpenBLAS's own choice)."""
    if _AVX512 <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Zen" if vendor == "AuthenticAMD" else "Haswell"
    return None


def openblas_loaded():
    """Whether a shared libopenblas.so (Debian's, the one twell links) is mapped into this process
    (Linux: /proc/self/maps; numpy's bundled OpenBLAS has another name); False where unreadable."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return any("libopenblas.so" in line for line in f)
    except OSError:
        return False


def prepare(environ=os.environ, cpu=cpu_flags, loaded=openblas_loaded, machine=platform.machine):
    """Sets OPENBLAS_CORETYPE in `environ` where nothing chose it yet and the CPU has AVX2 or
    AVX-512; returns what decides OpenBLAS's kernels."""
    if environ.get("OPENBLAS_CORETYPE"):
        return f"OPENBLAS_CORETYPE={environ['OPENBLAS_CORETYPE']} (environment)"
    if machine() not in ("x86_64", "AMD64"):
        return "OpenBLAS's own detection (not x86-64)"
    core = core_for(*cpu())
    if core is None:
        return "OpenBLAS's own detection (no AVX2)"
    if loaded():
        return ("OpenBLAS's own detection: it was loaded before twell (import twell first, or set "
                f"OPENBLAS_CORETYPE={core})")
    environ["OPENBLAS_CORETYPE"] = core
    return f"{core} (set by twell)"


CORETYPE = prepare()
