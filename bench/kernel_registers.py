"""What ptxas makes of each CUDA kernel body, on a machine without a GPU:
registers a thread, spill stores and loads, shared memory, for every
variant `tests/python/test_cuda_kernels.py` compiles (the template
arguments the Rust side passes), through NVRTC for sm_90 with
`--ptxas-options=-v`.

    .venv/bin/python bench/kernel_registers.py [SUBSTRING]

SUBSTRING keeps the variants whose label holds it (e.g. `qmm`, `MT=4`,
`gdn_layer`). A block of 256 threads at more than 128 registers leaves an
SM one block; spills go to local memory (docs/gpu.md, "64-row tiles").
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/python"))
import test_cuda_kernels as kernels  # noqa: E402  (variants, wrap, NVRTC)


def main() -> None:
    keep = sys.argv[1] if len(sys.argv) > 1 else ""
    lib = kernels.nvrtc()
    print(f"{'variant':<72} {'regs':>5} {'spill st':>8} {'spill ld':>8} {'smem':>7}")
    for label, body, inputs, outputs, template in kernels.variants():
        if keep not in label:
            continue
        status, log = kernels.compile_log(lib, kernels.wrap(body, inputs, outputs, template),
                                          [b"--ptxas-options=-v"])
        if status != 0:
            print(f"{label:<72} compile error: {log.splitlines()[0] if log else status}")
            continue

        def number(pattern: str) -> str:
            found = re.search(pattern, log)
            return found.group(1) if found else "?"

        regs = number(r"Used (\d+) registers")
        stores = number(r"(\d+) bytes spill stores")
        loads = number(r"(\d+) bytes spill loads")
        smem = number(r"(\d+) bytes smem")
        print(f"{label:<72} {regs:>5} {stores:>8} {loads:>8} {smem:>7}")

if __name__ == "__main__":
    main()
