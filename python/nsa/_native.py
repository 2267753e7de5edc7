"""ctypes bindings of nsa's C libraries (include/NSA-c/, nsa_runtime.h).

The libraries are looked up in $NSA_LIBRARY_DIR, then in the folder two
levels above this package (<build>/lib or <prefix>/lib, where the package
lives in lib/python/nsa). Each is loaded on first use, so CPU-only use never
needs the GPU runtime and GPU use never needs MLIR.
"""

import ctypes
import os
import threading

c_int64 = ctypes.c_int64
c_int32 = ctypes.c_int32
c_int = ctypes.c_int
c_double = ctypes.c_double
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p

# Each Structure below mirrors the C struct named by its `c_name`, field for
# field under the C names; test/Python/test_abi.py compiles the headers and
# checks every size and offset, so the two cannot drift apart.

# nsaDType (nsa_runtime.h)
BF16, F16, F32 = 0, 1, 2


class LayerConfig(ctypes.Structure):
    """nsaLayerConfig (NSA-c/Layer.h)."""
    c_name = "nsaLayerConfig"
    _fields_ = [("cmpBlock", c_int64), ("cmpStride", c_int64),
                ("slcBlock", c_int64), ("numSelected", c_int64),
                ("window", c_int64), ("scale", c_double),
                ("linearPool", c_int32), ("reserved", c_int32),
                ("initialBlocks", c_int64), ("localBlocks", c_int64),
                ("logLevels", c_int64), ("hubStride", c_int64),
                ("blocks", ctypes.POINTER(c_int64)), ("numBlocks", c_int64),
                ("maxTokens", c_int64)]


class LayerDesc(ctypes.Structure):
    """nsaLayerDesc (NSA-c/Layer.h)."""
    c_name = "nsaLayerDesc"
    _fields_ = [("qHeads", c_int64), ("kvHeads", c_int64),
                ("qkDim", c_int64), ("vDim", c_int64), ("dtype", c_int),
                ("packed", c_int32), ("config", LayerConfig)]


class Layer(ctypes.Structure):
    """nsaLayer (nsa_runtime.h)."""
    c_name = "nsaLayer"
    _fields_ = [("name", c_char_p), ("qHeads", c_int64), ("kvHeads", c_int64),
                ("qkDim", c_int64), ("vDim", c_int64), ("cmpBlock", c_int64),
                ("dtype", c_int), ("packed", c_int), ("learnedPool", c_int),
                ("entry", c_void_p), ("slcBlock", c_int64),
                ("numSelected", c_int64), ("train", c_void_p),
                ("backward", c_void_p), ("decodeQueries", c_int64),
                ("cmpStride", c_int64), ("decode", c_void_p)]


class LayerArgs(ctypes.Structure):
    """nsaLayerArgs (nsa_runtime.h)."""
    c_name = "nsaLayerArgs"
    _fields_ = [("batch", c_int64), ("tokens", c_int64), ("dtype", c_int),
                ("q", c_void_p), ("k", c_void_p), ("v", c_void_p),
                ("gates", c_void_p), ("cmpWeights", c_void_p),
                ("cuSeqlens", c_void_p), ("numSeqlens", c_int64),
                ("out", c_void_p)]


class LayerSaved(ctypes.Structure):
    """nsaLayerSaved (nsa_runtime.h): the training forward's saved state."""
    c_name = "nsaLayerSaved"
    _fields_ = [("cmpOut", c_void_p), ("cmpLse", c_void_p),
                ("indices", c_void_p), ("slcOut", c_void_p),
                ("slcLse", c_void_p), ("winOut", c_void_p),
                ("winLse", c_void_p)]


class LayerGrads(ctypes.Structure):
    """nsaLayerGrads (nsa_runtime.h)."""
    c_name = "nsaLayerGrads"
    _fields_ = [("dout", c_void_p), ("dq", c_void_p), ("dk", c_void_p),
                ("dv", c_void_p), ("dgates", c_void_p),
                ("dcmpWeights", c_void_p)]


class LayerEntry(ctypes.Structure):
    """nsaLayerEntry (NSA-c/Runtime.h)."""
    c_name = "nsaLayerEntry"
    _fields_ = [("layer", Layer), ("desc", LayerDesc), ("pipeline", c_char_p)]


def library_dir():
    """Where nsa's libraries are: $NSA_LIBRARY_DIR, else nsa/lib in an
    installed wheel, else two folders up (<build or prefix>/lib/python/nsa
    -> <build or prefix>/lib)."""
    env = os.environ.get("NSA_LIBRARY_DIR")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    wheel = os.path.join(here, "lib")
    if os.path.isdir(wheel):
        return wheel
    return os.path.normpath(os.path.join(here, "..", ".."))


_lock = threading.Lock()
_loaded = {}


def _load(name, path=None):
    with _lock:
        key = path or name
        if key not in _loaded:
            path = path or os.path.join(library_dir(), name)
            try:
                _loaded[key] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise OSError(f"nsa: cannot load {path}: {e} (set "
                              f"NSA_LIBRARY_DIR to the folder of nsa's "
                              f"libraries)") from None
            _declare(name, _loaded[key])
        return _loaded[key]


def last_error():
    """The calling thread's last nsa error (NSA-c/Error.h): one message
    for every nsa library, in libnsa_error, which each of them links."""
    return _load("libnsa_error.so").nsaGetLastError().decode()


def _declare(name, lib):
    P = ctypes.POINTER
    if name == "libnsa_error.so":
        lib.nsaGetLastError.restype = c_char_p
    elif name == "libNSA-C.so":
        lib.nsaCpuLayerCreate.restype = c_void_p
        lib.nsaCpuLayerCreate.argtypes = [P(LayerDesc)]
        lib.nsaCpuLayerCreateTrainable.restype = c_void_p
        lib.nsaCpuLayerCreateTrainable.argtypes = [P(LayerDesc)]
        lib.nsaCpuLayerDestroy.argtypes = [c_void_p]
        lib.nsaCpuLayerSource.restype = c_char_p
        lib.nsaCpuLayerSource.argtypes = [c_void_p]
        lib.nsaCpuLayerForward.restype = c_int
        lib.nsaCpuLayerForward.argtypes = [c_void_p, c_int64, c_int64] + \
            [c_void_p] * 6 + [c_int64, c_void_p]
        lib.nsaCpuLayerBackward.restype = c_int
        lib.nsaCpuLayerBackward.argtypes = [c_void_p, c_int64, c_int64] + \
            [c_void_p] * 6 + [c_int64] + [c_void_p] * 6
    elif name == "libnsa_reference.so":
        lib.nsaReferenceForwardWithMargins.restype = c_int
        lib.nsaReferenceForwardWithMargins.argtypes = [
            P(LayerDesc), c_int64, c_int64] + [c_void_p] * 6 + [
            c_int64, c_void_p, c_void_p, c_void_p]
        lib.nsaReferenceBackward.restype = c_int
        lib.nsaReferenceBackward.argtypes = [
            P(LayerDesc), c_int64, c_int64] + [c_void_p] * 6 + [
            c_int64] + [c_void_p] * 7
    elif name == "libnsa_runtime.so":
        lib.nsaInit.restype = c_int
        lib.nsaInit.argtypes = [c_int]
        lib.nsaLayerForward.restype = c_int
        lib.nsaLayerForward.argtypes = [P(Layer), P(LayerArgs)]
        lib.nsaLayerForwardTrain.restype = c_int
        lib.nsaLayerForwardTrain.argtypes = [P(Layer), P(LayerArgs),
                                             P(LayerSaved)]
        lib.nsaLayerBackward.restype = c_int
        lib.nsaLayerBackward.argtypes = [P(Layer), P(LayerArgs),
                                         P(LayerSaved), P(LayerGrads)]
    else:  # a layer library
        lib.nsaLayerLibraryCount.restype = c_int64
        lib.nsaLayerLibraryGet.restype = P(LayerEntry)
        lib.nsaLayerLibraryGet.argtypes = [c_int64]


def capi():
    return _load("libNSA-C.so")


def reference_lib():
    return _load("libnsa_reference.so")


def runtime():
    return _load("libnsa_runtime.so")


def layer_library(path=None):
    runtime()  # its symbols first: the layer library links it
    return _load("libnsa_layers.so", path)
