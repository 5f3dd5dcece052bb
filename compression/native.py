"""A small C kernel for the blockwise and ternary encoders on CPU, built at first use and cached.

``torch.compile`` fuses each encoder into one Inductor loop nest, but on CPU that nest still stays
well below the memory roofline: the codes land in a tensor that is then copied into the
packet's ``bytes``, the per-block reduction and the quantisation are laid out as two loops, and the
ternary hash runs on 64-bit index lanes. This module compiles a few dozen lines of C (OpenMP over
blocks, vectorisable inner loops) into a shared library and calls it through ``ctypes``:

* one streaming pass over the input: each block (a few KiB, in L1) is reduced to its absmax and
  quantised/packed while it is still in cache;
* the codes and scales are written straight into the ``bytes`` objects the ``Packet`` keeps
  (CPython's ``PyBytes_FromStringAndSize(NULL, n)`` makes an uninitialised bytes object that its
  creator fills before anyone else sees it), so there is no codes tensor and no copy;
* the ternary draws use the codec's 32-bit counter hash of ``(base + index) mod 2**32`` inside the
  loop: no random tensor is ever materialised.

Bit-identity. The C code performs, element by element, the same IEEE float32 operations as the eager
torch kernels (``round`` half to even via ``rintf``, ``127 / absmax`` as torch evaluates it,
``reciprocal(absmax) * 127``, the same comparisons and integer hash), and no ``-ffast-math``, so the
packets are byte-for-byte those of the eager path; the tests check it on random and edge-case inputs.
The absmax is an integer maximum over the bit patterns of ``|x|`` (for non-negative floats the integer
order is the float order, and any NaN sorts above infinity), so a NaN anywhere makes the maximum NaN
and the codec rejects the input as the torch path does.

Build and fallback. The library is compiled once per source/flags/CPU-capability combination with the
system C compiler (``cc``) into ``$SWARMTRAIN_NATIVE_DIR`` or
``~/.cache/swarmtrain/native`` (an atomic rename makes concurrent builds by several processes safe)
and links the OpenMP runtime torch already loaded, so both share one thread pool. If anything fails
(no compiler, no OpenMP, read-only cache) one warning is logged and the codecs keep their
``torch.compile``/eager path. ``SWARMTRAIN_NATIVE_CODECS=0`` disables the kernel; only float32 CPU
tensors use it (CUDA, float16 and bfloat16 inputs take the torch path).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

__all__ = [
    "ENV_NATIVE",
    "ENV_NATIVE_DIR",
    "native_mode",
    "available",
    "library",
    "encode_blockwise",
    "encode_ternary",
    "SOURCE",
]

log = logging.getLogger(__name__)

ENV_NATIVE = "SWARMTRAIN_NATIVE_CODECS"
ENV_NATIVE_DIR = "SWARMTRAIN_NATIVE_DIR"

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>

/* max of the bit patterns of |x|: the float absmax, NaN if any element is NaN */
static inline uint32_t absmax_bits(const float *x, int64_t n) {
    uint32_t m = 0;
    #pragma omp simd reduction(max:m)
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, 4);
        b &= 0x7FFFFFFFu;
        m = b > m ? b : m;
    }
    return m;
}

static inline float bits_float(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }

/* torch evaluates `q / am` as `reciprocal(am) * q` */
static inline float inv_scale(float am, float qmax) { return am > 0.0f ? (1.0f / am) * qmax : 0.0f; }

/* rint((v * up) * inv) clamped to [-qmax, qmax]. With inv finite (see block_q), |v * up * inv| is
   below qmax + 0.01 for every finite v, so clamping the int32 equals torch's float clamp; inputs with
   non-finite values are rejected by the caller whatever their codes. */
static inline int32_t quant(float v, float up, float inv, int32_t qmax) {
    int32_t q = (int32_t)rintf((v * up) * inv);
    q = q < -qmax ? -qmax : q;
    return q > qmax ? qmax : q;
}

/* 2**64 for blocks whose absmax is below 2**-64, else 1: an exact rescale keeping scales finite */
static inline float tiny_up(float am) { return am < 0x1p-64f ? 0x1p64f : 1.0f; }

/* one block of n elements (n even for 4 bits); codes: n or n/2 bytes; returns |x| max bits */
static uint32_t block_q(const float *x, int64_t n, int bits, uint8_t *codes) {
    uint32_t mb = absmax_bits(x, n);
    float am = bits_float(mb);
    /* blocks with absmax < 2**-64 are scaled by 2**64 (exact) so that qmax / absmax stays finite */
    const float up = tiny_up(am);
    if (bits == 8) {
        const float inv = inv_scale(am * up, 127.0f);
        int8_t *c = (int8_t *)codes;
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) c[i] = (int8_t)quant(x[i], up, inv, 127);
    } else {
        const float inv = inv_scale(am * up, 7.0f);
        const int64_t h = n / 2;
        #pragma omp simd
        for (int64_t j = 0; j < h; j++) {
            int32_t lo = quant(x[j], up, inv, 7) + 8;
            int32_t hi = quant(x[j + h], up, inv, 7) + 8;
            codes[j] = (uint8_t)(lo | (hi << 4));
        }
    }
    return mb;
}

/* the draw's cell numerator: float32(k + 0.5) for the 24-bit hash k; the draw is this * 2**-24 */
static inline float hash_r(uint32_t h) {
    h = (h >> 16) ^ h; h *= 0x45D9F3Bu;
    h = (h >> 16) ^ h; h *= 0x45D9F3Bu;
    h = (h >> 16) ^ h;
    return (float)(h >> 8) + 0.5f;
}

/* code 1 (+1) or 2 (-1) when the draw keeps v, else 0 (a kept v is nonzero, so its sign bit is
   its sign). S = s * 2**-24 (exact), so r * S is the torch path's rounded (r * 2**-24) * s. */
static inline uint32_t tcode(float v, float S, float up, uint32_t h) {
    uint32_t b;
    memcpy(&b, &v, 4);
    return hash_r(h) * S < fabsf(v) * up ? 1u + (b >> 31) : 0u;
}

#define TERNARY_LOOP(UP)                                                                          \
    _Pragma("omp simd")                                                                           \
    for (int64_t j = 0; j < w; j++) {                                                             \
        uint32_t h = h0 + (uint32_t)j;                                                            \
        uint32_t c = tcode(x[j], S, UP, h) | (tcode(x[j + w], S, UP, h + uw) << 2)                \
                   | (tcode(x[j + 2 * w], S, UP, h + 2 * uw) << 4)                                \
                   | (tcode(x[j + 3 * w], S, UP, h + 3 * uw) << 6);                               \
        codes[j] = (uint8_t)c;                                                                    \
    }

/* one ternary block of n elements (n % 4 == 0) whose first element has hash counter h0 */
static uint32_t block_t(const float *x, int64_t n, uint32_t h0, uint8_t *codes) {
    uint32_t mb = absmax_bits(x, n);
    float am = bits_float(mb);
    /* keep with probability |v| / absmax as u * s < |v|; tiny blocks are scaled by 2**64 (exact) */
    const float up = tiny_up(am);
    const float S = (am > 0.0f ? am : 1.0f) * up * 0x1p-24f;
    const int64_t w = n / 4;
    const uint32_t uw = (uint32_t)w;
    if (up != 1.0f) {
        TERNARY_LOOP(up)
    } else { /* the common case: |v| * 1 needs no multiply */
        TERNARY_LOOP(1.0f)
    }
    return mb;
}

/* kind 8/4: blockwise int8/int4 (scales = absmax * float32(1/qmax)); kind 2: ternary (scales =
   absmax, hash base `base`). The last block may be short: it is zero-padded to whole code bytes
   and only its ceil(len * bits / 8) code bytes are written. Returns the max bits of |x|. */
uint32_t sw_encode(int kind, const float *x, int64_t n, int64_t block, uint32_t base,
                   uint8_t *codes, float *scales, int threads) {
    const int bits = kind;
    const int64_t nfull = n / block, tail = n - nfull * block;
    const float mul = kind == 8 ? (float)(1.0 / 127.0) : (kind == 4 ? (float)(1.0 / 7.0) : 1.0f);
    uint32_t top = 0;
    /* dynamic chunks of ~64K elements: on a shared machine a preempted thread's work moves to the
       other threads instead of holding up the whole call */
    const int64_t chunk = block >= 65536 ? 1 : 65536 / block;
    #pragma omp parallel for schedule(dynamic, chunk) num_threads(threads) reduction(max:top)
    for (int64_t b = 0; b < nfull; b++) {
        const float *xb = x + b * block;
        uint8_t *cb = codes + b * block * bits / 8;
        uint32_t mb = kind == 2 ? block_t(xb, block, base + (uint32_t)(b * block), cb)
                                : block_q(xb, block, bits, cb);
        scales[b] = bits_float(mb) * mul;
        top = mb > top ? mb : top;
    }
    if (tail) {
        const int64_t unit = 8 / bits, width = tail + (unit - tail % unit) % unit;
        float *pad = (float *)calloc((size_t)width, sizeof(float));
        uint8_t *out = (uint8_t *)malloc((size_t)(width * bits / 8));
        if (!pad || !out) { free(pad); free(out); return 0xFFFFFFFFu; /* NaN: caller rejects */ }
        memcpy(pad, x + nfull * block, (size_t)tail * sizeof(float));
        uint32_t mb = kind == 2 ? block_t(pad, width, base + (uint32_t)(nfull * block), out)
                                : block_q(pad, width, bits, out);
        memcpy(codes + nfull * block * bits / 8, out, (size_t)((tail * bits + 7) / 8));
        scales[nfull] = bits_float(mb) * mul;
        top = mb > top ? mb : top;
        free(pad);
        free(out);
    }
    return top;
}
"""

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_failed = False

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_bytes_ptr = ctypes.pythonapi.PyBytes_AsString
_bytes_ptr.restype = ctypes.c_void_p
_bytes_ptr.argtypes = [ctypes.py_object]


def native_mode() -> str:
    """``"off"`` when ``SWARMTRAIN_NATIVE_CODECS`` is 0/off/false/no, else ``"auto"``."""
    raw = os.environ.get(ENV_NATIVE, "").strip().lower()
    return "off" if raw in ("0", "off", "false", "no") else "auto"


def _arch_flags() -> list[str]:
    """Instruction-set flags matching the capability torch detected (part of the cache key)."""
    cap = torch.backends.cpu.get_cpu_capability()
    if cap == "AVX512":
        return ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"]
    if cap == "AVX2":
        return ["-mavx2", "-mfma"]
    return []


def _omp_runtime() -> str | None:
    """The OpenMP runtime bundled with torch (linked so that both share one thread pool)."""
    lib_dir = Path(torch.__file__).parent / "lib"
    for name in ("libgomp.so.1", "libiomp5.so", "libomp.so"):
        if (lib_dir / name).exists():
            return str(lib_dir / name)
    return None


def _cache_dir() -> Path:
    raw = os.environ.get(ENV_NATIVE_DIR)
    if raw:
        return Path(raw)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swarmtrain" / "native"


def _build() -> ctypes.CDLL:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        raise RuntimeError("no C compiler (cc) on this Linux host" if cc is None else "Linux only")
    omp = _omp_runtime()
    link = [omp, f"-Wl,-rpath,{Path(omp).parent}"] if omp else ["-lgomp"]
    flags = ["-O3", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno", *_arch_flags()]
    key = hashlib.sha256("\0".join([SOURCE, cc, *flags, *link, torch.__version__]).encode()).hexdigest()
    out_dir = _cache_dir()
    target = out_dir / f"swcodec_{key[:16]}.so"
    if not target.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            src = Path(tmp) / "swcodec.c"
            src.write_text(SOURCE, encoding="utf-8")
            so = Path(tmp) / "swcodec.so"
            res = subprocess.run(
                [cc, *flags, str(src), "-o", str(so), *link], capture_output=True, text=True, timeout=300
            )
            if res.returncode != 0:
                raise RuntimeError(f"{cc} failed: {res.stderr.strip()[-2000:]}")
            os.replace(so, target)  # atomic: a concurrent build by another process is harmless
    lib = ctypes.CDLL(str(target))
    fn = lib.sw_encode
    fn.restype = ctypes.c_uint32
    fn.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_uint32,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on first call; ``None`` if disabled or unavailable."""
    global _lib, _failed
    if _lib is not None or _failed or native_mode() == "off":
        return _lib if native_mode() != "off" else None
    with _lock:
        if _lib is None and not _failed:
            try:
                _lib = _build()
            except Exception as e:  # no compiler, no OpenMP, unwritable cache: stay correct
                _failed = True
                log.warning("native codec kernel unavailable (%s); using the torch path", e)
    return _lib


def available() -> bool:
    """Whether the native kernel is (or can be) loaded in this process."""
    return library() is not None


def _fresh_bytes(size: int) -> tuple[bytes, int]:
    """An uninitialised ``bytes`` of ``size`` (>= 2) bytes and the address of its buffer."""
    b = _new_bytes(None, size)
    return b, int(_bytes_ptr(b))


def _usable(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous() and x.numel() >= 8


def _encode(kind: int, x: torch.Tensor, block: int, base: int) -> tuple[bytes, bytes, float] | None:
    if type(block) is not int or block < 8 or block % 8:
        raise ValueError(f"block must be a positive multiple of 8, not {block!r}")
    if not _usable(x):
        return None
    lib = library()
    if lib is None:
        return None
    x = x.reshape(-1)
    n = x.numel()
    nblocks = -(-n // block)
    codes, codes_at = _fresh_bytes((n * kind + 7) // 8)
    scales, scales_at = _fresh_bytes(4 * nblocks)
    top_bits = lib.sw_encode(
        kind, x.data_ptr(), n, block, base & 0xFFFFFFFF, codes_at, scales_at, torch.get_num_threads()
    )
    return codes, scales, struct.unpack("<f", struct.pack("<I", top_bits))[0]


def encode_blockwise(x: torch.Tensor, block: int, bits: int) -> tuple[bytes, bytes, float] | None:
    """Blockwise absmax codes (``bits`` 8 or 4) of ``x`` straight into packet bytes.

    Returns ``(codes, scales, top)`` with the exact bytes of the torch path (scales already
    multiplied by ``float32(1 / qmax)``) and ``top`` the largest block absmax (NaN if ``x`` holds a
    NaN), or ``None`` when the native kernel does not apply (not a contiguous float32 CPU tensor of
    at least 8 elements, disabled, or unavailable).
    """
    if bits not in (8, 4):
        raise ValueError(f"bits must be 8 or 4, not {bits}")
    return _encode(bits, x, block, 0)


def encode_ternary(x: torch.Tensor, block: int, base: int) -> tuple[bytes, bytes, float] | None:
    """Ternary codes and block absmax of ``x`` with hash base ``base``; see ``encode_blockwise``."""
    return _encode(2, x, block, base)
