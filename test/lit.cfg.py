# -*- Python -*-
# lit configuration of the nsa tests: FileCheck tests of nsa-opt and the
# executable checks that later pipelines add.

import os
import sys

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "NSA"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.nsa_obj_root, "test")

config.substitutions.append(("%nsa_src_root", config.nsa_src_root))
config.substitutions.append(("%nsa_obj_root", config.nsa_obj_root))
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(("%ptxas", config.ptxas))
# Upstream's mlir-opt with nsa loaded as a plugin (lib/Plugin).
config.substitutions.append(
    ("%mlir_opt", os.path.join(config.llvm_tools_dir, "mlir-opt")))
config.substitutions.append(
    ("%nsa_plugin", os.path.join(config.nsa_obj_root, "lib", "libNSAPlugin.so")))

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)

tools = [ToolSubst("nsa-opt", unresolved="fatal"),
         ToolSubst("nsa-gen-layer", unresolved="fatal"),
         ToolSubst("nsa-reach", unresolved="fatal")]
llvm_config.add_tool_substitutions(tools, [config.nsa_tools_dir])

if config.ptxas and not config.ptxas.endswith("-NOTFOUND"):
    config.available_features.add("ptxas")
