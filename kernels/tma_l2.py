"""TMA descriptors that fetch 256 bytes into L2 per miss instead of 128.

Triton 3.6's launcher encodes every host-side tensor descriptor with CU_TENSOR_MAP_L2_PROMOTION_L2_128B
(backends/nvidia/driver.c, fillTMADescriptor); DeepGEMM's streaming GEMMs use the 256-byte promotion. Inside
`l2_promotion_256()` each descriptor the launcher builds is encoded a second time through the driver's
cuTensorMapEncodeTiled with the same arguments and the 256-byte promotion, written over the launcher's copy.
The launcher's encoding is checked first (re-encoded with 128 bytes, it must match byte for byte), so a Triton
whose descriptor object or arguments differ fails loudly instead of launching a wrong copy.
"""

import contextlib
import ctypes

import triton

L2_128B, L2_256B = 2, 3  # CUtensorMapL2promotion
_DESC_OFFSET = 128  # PyCUtensorMapObject: PyObject_HEAD, then the 128-byte-aligned CUtensorMap
_DESC_BYTES = 128


def _encode_fn():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


def encode(address, swizzle, elem_size, elem_type, block, shape, strides, padding, promotion) -> bytes:
    """The 128 bytes of a tiled tensor map as Triton 3.6's fillTMADescriptor builds it (same argument order and
    conventions: sizes outermost first, strides in elements), with the given L2 promotion."""
    rank = len(block)
    buf = ctypes.create_string_buffer(_DESC_BYTES + 128)
    at = (ctypes.addressof(buf) + 127) // 128 * 128
    dims = (ctypes.c_uint64 * rank)(*reversed([int(s) for s in shape]))
    box = (ctypes.c_uint32 * rank)(*reversed([int(b) for b in block]))
    stride_bytes = [elem_size * int(s) for s in strides[:-1]]
    gstrides = (ctypes.c_uint64 * max(rank - 1, 1))(*reversed(stride_bytes))
    ones = (ctypes.c_uint32 * rank)(*([1] * rank))
    res = _encode_fn()(at, elem_type, rank, address, dims, gstrides, box, ones, 0, swizzle, promotion,
                       1 if padding == 1 else 0)
    if res != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {res} (shape {list(shape)}, "
                           f"box {list(block)})")
    return ctypes.string_at(at, _DESC_BYTES)


def _promote(fill, made):
    def fill_256(address, swizzle, elem_size, elem_type, block, shape, strides, padding):
        desc = fill(address, swizzle, elem_size, elem_type, block, shape, strides, padding)
        made.append(tuple(block))
        args = (address, swizzle, elem_size, elem_type, block, shape, strides, padding)
        at = id(desc) + _DESC_OFFSET
        if ctypes.string_at(at, _DESC_BYTES) != encode(*args, L2_128B):
            raise RuntimeError("this Triton's TMA descriptor is not the one kernels.tma_l2 re-encodes "
                               "(fillTMADescriptor changed): L2_256 cannot be applied")
        ctypes.memmove(at, encode(*args, L2_256B), _DESC_BYTES)
        return desc
    return fill_256


@contextlib.contextmanager
def l2_promotion_256():
    """Launches inside get TMA descriptors with 256-byte L2 promotion (host-side descriptors only). Yields the
    list of the box shapes re-encoded, so a caller can check its launch built any (a kernel lowered without
    descriptor arguments builds none)."""
    utils = triton.runtime.driver.active.utils
    fill = utils.fill_tma_descriptor
    made = []
    utils.fill_tma_descriptor = _promote(fill, made)
    try:
        yield made
    finally:
        utils.fill_tma_descriptor = fill
