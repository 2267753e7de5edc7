"""The Python package's ctypes structures against the C headers, and the
ahead-of-time layer library read through them, on the CPU.

Every ctypes.Structure in nsa._native names its C struct (`c_name`) and
uses the C field names. This test writes a C program from those names,
compiles it against include/ with the C compiler CMake found, and compares
each struct's size and each field's offset and size with ctypes'. A field
added on either side changes a size or an offset, or fails to compile.
Then it loads libnsa_layers (where the build made it: no GPU is needed to
read its registry) and checks that every layer is found with the
description it was compiled for. Run by ctest (test/CMakeLists.txt)."""

import ctypes
import os
import subprocess
import tempfile
import unittest

import torch

from common import nsa

_native = nsa._native


def structures():
    """Every ctypes structure the package declares."""
    return [c for c in vars(_native).values()
            if isinstance(c, type) and issubclass(c, ctypes.Structure)
            and c is not ctypes.Structure]


def c_program(structs):
    """Prints `<struct> <field|-> <offset> <size>` for every field."""
    lines = ['#include "NSA-c/Runtime.h"', "#include <stddef.h>",
             "#include <stdio.h>",
             "#define SZ(T, F) sizeof(((T *)0)->F)",
             "int main(void) {"]
    for s in structs:
        lines.append(f'  printf("{s.c_name} - 0 %zu\\n", sizeof({s.c_name}));')
        for name, _ in s._fields_:
            lines.append(f'  printf("{s.c_name} {name} %zu %zu\\n", '
                         f"offsetof({s.c_name}, {name}), "
                         f"SZ({s.c_name}, {name}));")
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def c_layout(structs):
    include = os.environ.get("NSA_INCLUDE_DIR")
    cc = os.environ.get("NSA_CC") or "cc"
    if not include:
        raise unittest.SkipTest("NSA_INCLUDE_DIR is not set")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "abi.c"), os.path.join(tmp, "abi")
        with open(src, "w") as f:
            f.write(c_program(structs))
        subprocess.run([cc, "-std=c11", "-I", include, src, "-o", exe],
                       check=True)
        out = subprocess.run([exe], check=True, capture_output=True,
                             text=True).stdout
    layout = {}
    for line in out.splitlines():
        struct, field, offset, size = line.split()
        layout[struct, field] = (int(offset), int(size))
    return layout


class StructLayout(unittest.TestCase):
    def test_every_structure_names_its_c_struct(self):
        for s in structures():
            self.assertTrue(getattr(s, "c_name", "").startswith("nsa"),
                            f"{s.__name__} has no c_name")

    def test_sizes_and_offsets_match_c(self):
        structs = structures()
        layout = c_layout(structs)
        for s in structs:
            self.assertEqual(ctypes.sizeof(s), layout[s.c_name, "-"][1],
                             f"sizeof({s.c_name})")
            for name, _ in s._fields_:
                field = getattr(s, name)
                self.assertEqual((field.offset, field.size),
                                 layout[s.c_name, name],
                                 f"{s.c_name}.{name} (offset, size)")


# What runtime/layers/CMakeLists.txt compiles into libnsa_layers.
AOT_LAYERS = {
    "paper": dict(q_heads=64, kv_heads=4, qk_dim=192, v_dim=128,
                  packed=False, config=nsa.NSAConfig()),
    "paper_d128": dict(q_heads=64, kv_heads=4, qk_dim=128, v_dim=128,
                       packed=False, config=nsa.NSAConfig()),
    "small": dict(q_heads=4, kv_heads=1, qk_dim=64, v_dim=64, packed=False,
                  config=nsa.NSAConfig(cmp_block=16, cmp_stride=8,
                                       slc_block=32, num_selected=4,
                                       window=64)),
    "small_packed": dict(q_heads=8, kv_heads=4, qk_dim=64, v_dim=32,
                         packed=True,
                         config=nsa.NSAConfig(cmp_block=16, cmp_stride=8,
                                              slc_block=32, num_selected=6,
                                              window=100, pool="linear")),
}


class LayerLibrary(unittest.TestCase):
    def setUp(self):
        path = os.path.join(_native.library_dir(), "libnsa_layers.so")
        if not os.path.exists(path):
            self.skipTest(f"{path} was not built (no CUDA toolkit)")

    def test_every_layer_is_found(self):
        found = {name: desc for name, desc, _ in nsa.gpu_layers()}
        self.assertEqual(set(found), set(AOT_LAYERS))
        for name, want in AOT_LAYERS.items():
            got = dict(found[name])
            self.assertEqual(got.pop("dtype"), torch.bfloat16, name)
            self.assertEqual(got, want, name)

    def test_entries_point_at_code(self):
        lib = _native.layer_library()
        for i in range(lib.nsaLayerLibraryCount()):
            layer = lib.nsaLayerLibraryGet(i).contents.layer
            name = layer.name.decode()
            self.assertTrue(layer.entry, name)
            self.assertEqual(bool(layer.train), name != "paper_d128", name)
            self.assertEqual(bool(layer.backward), name != "paper_d128",
                             name)
            self.assertEqual(layer.cmpBlock,
                             AOT_LAYERS[name]["config"].cmp_block, name)
            if layer.train:
                config = AOT_LAYERS[name]["config"]
                self.assertEqual((layer.slcBlock, layer.numSelected),
                                 (config.slc_block, config.num_selected),
                                 name)


if __name__ == "__main__":
    unittest.main(verbosity=2)
