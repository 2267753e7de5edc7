"""Reads an MLIR module from stdin, extracts the PTX of every gpu.binary
(nsa-to-ptx with format=isa), assembles each with `ptxas -v` for the given
architecture and prints ptxas's resource report (registers, shared memory,
spill bytes) for every kernel. Used by the lit tests:

  nsa-opt ... --nsa-to-ptx=format=isa | python3 ptxas-report.py PTXAS sm_90a
"""
import re
import subprocess
import sys
import tempfile

ptxas, arch = sys.argv[1], sys.argv[2]
text = sys.stdin.read()
pattern = (r'#gpu\.object<#nvvm\.target<[^>]*>,\s*(?:properties = \{[^}]*\},\s*)?'
           r'(?:assembly = )?"((?:[^"\\]|\\.)*)"')
status = 0
for index, match in enumerate(re.finditer(pattern, text)):
    # MLIR prints bytes as \XX (hex) and escapes quotes and backslashes.
    ptx = re.sub(r'\\([0-9A-Fa-f]{2})', lambda m: chr(int(m.group(1), 16)),
                 match.group(1)).replace('\\"', '"').replace('\\\\', '\\')
    with tempfile.NamedTemporaryFile('w', suffix='.ptx') as f:
        f.write(ptx)
        f.flush()
        result = subprocess.run([ptxas, '-arch=' + arch, '-v', f.name,
                                 '-o', '/dev/null'],
                                capture_output=True, text=True)
    print(f'module {index}:')
    print(result.stdout + result.stderr)
    status |= result.returncode
sys.exit(status)
