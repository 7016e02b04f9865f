"""The fused bf16 CPU kernels of `cpu_fused.c`, built on first use and called through ctypes.

Three steps of a decoder layer cost more in torch's op dispatch and copies than in arithmetic
when a step has a handful of tokens (docs/reference.md, "Fused CPU ops"): the residual add +
RMSNorm; rope on q and k + the KV-cache writes; and decode attention, which in torch first
gathers every sequence's keys and values out of the paged cache. `FusedCpuOps` does each in
one C call (~0.7 µs of ctypes overhead). The torch ops stay the reference: fp32, CUDA, and a
machine without a C compiler use them, and tests/engine/test_cpu_fused.py compares the two.

The shared library is compiled with the system's `cc` (-O3 -march=native, ~0.3 s) into a cache
folder, keyed by the source, the compiler, the flags and this CPU's flags, so a rebuilt or
moved checkout never loads a stale or foreign build; concurrent first uses each write their own
temporary file and rename it into place. Where torch runs below the CPU's own level (its
capability lowered with ATEN_CPU_CAPABILITY=avx2), the build is capped to match: the process
then runs what an AVX2 machine runs, fused ops included.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import cache
from typing import NamedTuple

import torch

log = logging.getLogger(__name__)

SOURCE = pathlib.Path(__file__).with_name("cpu_fused.c")
# Built into the same library: the 4-bit and 8-bit decode matmuls (quant.py's Q4Weight and
# Int8Weight).
SOURCES = (SOURCE, pathlib.Path(__file__).with_name("q4_matmul.c"),
           pathlib.Path(__file__).with_name("q8_matmul.c"))
HEADERS = (pathlib.Path(__file__).with_name("bf16.h"),
           pathlib.Path(__file__).with_name("act_quant.h"))
Q4_MAX_ROWS = 8                # q4_matmul_bf16's largest step
Q8_MAX_ROWS = 8                # q8_matmul_bf16's
# silu_mul_bf16 is one thread: above 2 rows torch's two threads win on AVX2 (1 / 2 / 4 / 512
# rows: 4.7 / 7.0 / 11.2 / 1,106 µs against torch's 6.2 / 7.7 / 9.9 / 402 on 2 threads),
# and on AVX-512 from some rows between 16 and 512 (19 vs 27 µs at 16, 548 vs 398 at 512).
SILU_MUL_MAX_ROWS = 2
# -std=c11 keeps fp contraction off (results are reproducible, the tests compare bits);
# -fno-math-errno lets the compiler inline sqrtf and vectorize expf through libmvec.
# -fopenmp links libgomp.so.1, the soname torch's CPU build loads: inside a torch process the
# kernels share torch's OpenMP threads instead of starting a second pool.
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fPIC", "-shared", "-std=c11")
LIBS = ("-lmvec", "-lm")
# torch's capability -> the flags that keep the build at that level on a CPU that has more.
# DEFAULT drops F16C too, so the build runs the portable C (q4_matmul.c's fp16 conversion).
ISA_CAPS = {"AVX2": ("-mno-avx512f",), "DEFAULT": ("-mno-avx512f", "-mno-avx2", "-mno-f16c")}
_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# What paged_decode_attention_bf16 is instantiated for; other models use torch's attention.
DECODE_HEAD_DIMS = (64, 128)
MAX_GROUP = 8                  # query heads per kv head


def cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "ttftscope"


def _writable_cache_dir() -> pathlib.Path:
    """`cache_dir()`, or a per-user folder in the temporary directory where that cannot be
    created (a read-only or missing home, as in some containers and CI runners)."""
    fallback = pathlib.Path(tempfile.gettempdir()) / f"ttftscope-{os.getuid()}"
    for folder in (cache_dir(), fallback):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    raise OSError(f"no writable folder for the fused ops' build: tried {cache_dir()} and {fallback}")


def _cpu_flags() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def build(compiler: str = "cc", isa: str | None = None) -> pathlib.Path:
    """Compile `cpu_fused.c` for torch's capability `isa` (None: the one torch reports) unless
    this exact build exists; the library's path."""
    cc = shutil.which(compiler)
    if cc is None:
        raise RuntimeError(f"no C compiler {compiler!r} on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    flags = CFLAGS + ISA_CAPS.get(isa or torch.backends.cpu.get_cpu_capability(), ())
    key = hashlib.sha256("\0".join([*(src.read_text() for src in SOURCES + HEADERS), version,
                                    " ".join(flags + LIBS), _cpu_flags()]).encode()).hexdigest()[:16]
    target = _writable_cache_dir() / f"cpu_fused-{key}.so"
    if target.exists():
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *flags, *map(str, SOURCES), "-o", tmp, *LIBS], check=True,
                       capture_output=True, text=True)
        os.replace(tmp, target)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"building {SOURCE.name} failed:\n{exc.stderr}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def require_bf16(tensor: torch.Tensor, name: str) -> None:
    """What every fused op needs of a tensor: contiguous bf16 on the CPU."""
    # ~420 checks a decode step (14 a layer): `is`, `is_cpu` and no device object cost 0.21 µs
    # a check against 0.54 for `!=` and `device.type` (docs/figures.md, "Where one stream
    # stands").
    if tensor.dtype is not torch.bfloat16 or not tensor.is_cpu or not tensor.is_contiguous():
        raise ValueError(f"{name}: the fused CPU ops take contiguous bf16 CPU tensors, got "
                         f"{tensor.dtype} on {tensor.device}, contiguous={tensor.is_contiguous()}")


class RawKernels(NamedTuple):
    """The ctypes functions behind `add_rms_norm`, `rope_store_kv`,
    `paged_decode_attention`, `q4_matmul` and `silu_mul`, unchecked
    (`FusedCpuOps.raw_kernels`)."""

    add_rms_norm: Callable
    rope_store_kv: Callable
    decode_attention: Callable
    q4_matmul: Callable          # returns 0, or -1 where its scratch could not be allocated
    silu_mul: Callable


class FusedCpuOps:
    """The two kernels, with the shape checks C cannot make."""

    def __init__(self, library: pathlib.Path) -> None:
        # PyDLL keeps the GIL through each call: they take microseconds, and releasing the
        # GIL 120 times a step lets the server's other threads take it in between. Measured
        # server token gap, one stream: 7.3 ms with PyDLL, 7.3-7.6 ms with CDLL.
        lib = ctypes.PyDLL(str(library))
        self._add_rms_norm = lib.add_rms_norm_bf16
        self._add_rms_norm.argtypes = [_P, _P, _P, _P, _I64, _I64, _F32]
        self._add_rms_norm.restype = None
        self._rope_store_kv = lib.rope_store_kv_bf16
        self._rope_store_kv.argtypes = [_P, _I64, _I64, _I64, _I64, _I64, _P, _P, _P, _P, _P]
        self._rope_store_kv.restype = None
        self._decode_attention = lib.paged_decode_attention_bf16
        self._decode_attention.argtypes = [_P, _I64, _P, _P, _P, _I64, _P, _I64, _I64, _I64,
                                           _I64, _I64, _F32, _P, _I64, _I64, _P]
        self._decode_attention.restype = None
        self._q4_matmul = lib.q4_matmul_bf16
        self._q4_matmul.argtypes = [_P, _I64, _I64, _P, _P, _P, _I64, _I64, _P]
        self._q4_matmul.restype = ctypes.c_int
        self._silu_mul = lib.silu_mul_bf16
        self._silu_mul.argtypes = [_P, _I64, _I64, _P]
        self._silu_mul.restype = None
        self._q8_matmul = lib.q8_matmul_bf16
        self._q8_matmul.argtypes = [_P, _I64, _I64, _P, _P, _I64, _I64, _P]
        self._q8_matmul.restype = ctypes.c_int

    def raw_kernels(self) -> RawKernels:
        """The C entry points without the checks this class makes on every call, for a
        caller that checks its tensors once for many calls (decode_fast.py). Their arguments
        are the ones the methods below pass."""
        return RawKernels(self._add_rms_norm, self._rope_store_kv, self._decode_attention,
                          self._q4_matmul, self._silu_mul)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] += delta (in place, when given); -> (x, rms_norm(x) · weight)."""
        require_bf16(x, "x")
        require_bf16(weight, "weight")
        if delta is not None:
            require_bf16(delta, "delta")
            if delta.shape != x.shape:
                raise ValueError(f"delta {tuple(delta.shape)} does not match x {tuple(x.shape)}")
        rows, dim = x.shape
        if weight.shape != (dim,):
            raise ValueError(f"weight {tuple(weight.shape)} does not match the hidden size {dim}")
        out = torch.empty_like(x)
        self._add_rms_norm(x.data_ptr(), None if delta is None else delta.data_ptr(),
                           weight.data_ptr(), out.data_ptr(), rows, dim, eps)
        return x, out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2I] (gate, then up, in each row) -> silu(gate) · up [T, I], rounded as
        torch's bf16 ops round."""
        require_bf16(gate_up, "gate_up")
        if gate_up.dim() != 2 or gate_up.shape[1] % 2:
            raise ValueError(f"silu_mul: gate_up {tuple(gate_up.shape)} is not [T, 2I]")
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        out = gate_up.new_empty(rows, width)
        self._silu_mul(gate_up.data_ptr(), rows, width, out.data_ptr())
        return out

    def rope_store_kv(self, qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int,
                      cos: torch.Tensor, sin_signed: torch.Tensor, slot_mapping: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """Rotate q and k inside qkv [T, (nh + 2 kvh) · hd] in place by cos / sin_signed
        [T, 1, hd], and write k and v to their slots of the caches [blocks, bs, kvh, hd].

        Slots are not bounds-checked here: the model runner validates every block id before
        the step (`ModelRunner._check`), and each slot lies in one of those blocks."""
        for tensor, name in ((qkv, "qkv"), (cos, "cos"), (sin_signed, "sin_signed"),
                             (k_cache, "k_cache"), (v_cache, "v_cache")):
            require_bf16(tensor, name)
        tokens, row = qkv.shape
        head_dim = k_cache.shape[-1]
        if (row != (num_q_heads + 2 * num_kv_heads) * head_dim or head_dim % 2
                or k_cache.shape[-2] != num_kv_heads or k_cache.shape != v_cache.shape
                or cos.shape != (tokens, 1, head_dim) or sin_signed.shape != cos.shape
                or slot_mapping.shape != (tokens,) or slot_mapping.dtype != torch.int64
                or not slot_mapping.is_contiguous()):
            raise ValueError("rope_store_kv: shapes do not fit together: "
                             f"qkv {tuple(qkv.shape)}, heads {num_q_heads}+{num_kv_heads}, cos "
                             f"{tuple(cos.shape)}, slots {tuple(slot_mapping.shape)}, cache "
                             f"{tuple(k_cache.shape)}")
        self._rope_store_kv(qkv.data_ptr(), tokens, row, num_q_heads, num_kv_heads, head_dim,
                            cos.data_ptr(), sin_signed.data_ptr(), slot_mapping.data_ptr(),
                            k_cache.data_ptr(), v_cache.data_ptr())

    def q4_matmul(self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                  minimum: torch.Tensor) -> torch.Tensor:
        """x [M, K] bf16 (M <= Q4_MAX_ROWS) -> x · Wᵀ [M, N] bf16, W as `quant.Q4Weight` holds
        it: packed [N, K/2] uint8, scale and minimum [N, K/32] fp16 (`q4_matmul.c`). The
        weight's own layout is checked once, when `Q4Weight` is built; here only x, on every
        call of the decode step."""
        require_bf16(x, "x")
        rows, k = x.shape
        if not 1 <= rows <= Q4_MAX_ROWS or k != 2 * packed.shape[1]:
            raise ValueError(f"q4_matmul: x {tuple(x.shape)} does not fit the weight "
                             f"[{packed.shape[0]}, {2 * packed.shape[1]}] (rows <= {Q4_MAX_ROWS})")
        out = x.new_empty(rows, packed.shape[0])
        if self._q4_matmul(x.data_ptr(), rows, k, packed.data_ptr(), scale.data_ptr(),
                           minimum.data_ptr(), packed.shape[0], torch.get_num_threads(),
                           out.data_ptr()):
            raise MemoryError(f"q4_matmul: no memory for {rows} x {k} rounded activations")
        return out

    def q8_matmul(self, x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """x [M, K] bf16 (M <= Q8_MAX_ROWS, K a multiple of 32) -> x · Wᵀ [M, N] bf16, W as
        `quant.Int8Weight` holds it: codes [N, K] int8, scale [N] bf16 (`q8_matmul.c`); the
        weight's layout is checked when `Int8Weight` takes this path, x here."""
        require_bf16(x, "x")
        rows, k = x.shape
        if not 1 <= rows <= Q8_MAX_ROWS or k != codes.shape[1] or k % 32:
            raise ValueError(f"q8_matmul: x {tuple(x.shape)} does not fit the weight "
                             f"{tuple(codes.shape)} (rows <= {Q8_MAX_ROWS}, K a multiple of 32)")
        out = x.new_empty(rows, codes.shape[0])
        if self._q8_matmul(x.data_ptr(), rows, k, codes.data_ptr(), scale.data_ptr(),
                           codes.shape[0], torch.get_num_threads(), out.data_ptr()):
            raise MemoryError(f"q8_matmul: no memory for {rows} x {k} rounded activations")
        return out

    @staticmethod
    def decode_attention_fits(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        """Whether `paged_decode_attention` has an instance for this attention shape."""
        return (head_dim in DECODE_HEAD_DIMS and num_heads % num_kv_heads == 0
                and num_heads // num_kv_heads <= MAX_GROUP)

    def paged_decode_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor,
                               max_context_len: int) -> torch.Tensor:
        """q [D, nh, hd] (rows may be strided: q is a view into the qkv projection), caches
        [blocks, bs, kvh, hd], block_tables [D, max_blocks] int64, context_lens [D] int64
        (each ≤ max_context_len ≤ max_blocks · bs) -> [D, nh, hd].

        As with the slots, the block ids and lengths come from the model runner, which
        validated them; the shapes are checked here."""
        for tensor, name in ((q[0], "q's rows"), (k_cache, "k_cache"), (v_cache, "v_cache")):
            require_bf16(tensor, name)
        seqs, num_heads, head_dim = q.shape
        num_blocks, block_size, num_kv_heads, _ = k_cache.shape
        if (k_cache.shape[-1] != head_dim or v_cache.shape != k_cache.shape
                or not self.decode_attention_fits(num_heads, num_kv_heads, head_dim)
                or block_tables.shape[0] != seqs or context_lens.shape != (seqs,)
                or max_context_len > block_tables.shape[1] * block_size
                or block_tables.dtype != torch.int64 or context_lens.dtype != torch.int64
                or not block_tables.is_contiguous() or not context_lens.is_contiguous()):
            raise ValueError("paged_decode_attention: shapes do not fit together: q "
                             f"{tuple(q.shape)}, cache {tuple(k_cache.shape)}, tables "
                             f"{tuple(block_tables.shape)}, lens {tuple(context_lens.shape)}")
        group = num_heads // num_kv_heads
        threads = torch.get_num_threads()
        scores = torch.empty(threads * group * max_context_len, dtype=torch.float32)
        out = q.new_empty(q.shape)
        self._decode_attention(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                               block_tables.data_ptr(), block_tables.shape[1],
                               context_lens.data_ptr(), seqs, num_heads, num_kv_heads, head_dim,
                               block_size, head_dim ** -0.5, scores.data_ptr(), max_context_len,
                               threads, out.data_ptr())
        return out


@cache
def load(isa: str | None = None) -> FusedCpuOps | None:
    """The kernels built for torch's capability `isa` (None: the one torch reports), or None
    (logged once) where they cannot be built: the torch ops then run."""
    try:
        return FusedCpuOps(build(isa=isa))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        log.warning("fused CPU ops unavailable, using torch ops: %s", exc)
        return None
