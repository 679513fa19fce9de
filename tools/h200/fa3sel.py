"""Zero the FA3 cubins an fp16 run on SM90 never calls, in sgl_kernel's flash_ops.abi3.so.

    python tools/h200/fa3sel.py FATBIN_PRUNE_DIR flash_ops.abi3.so [zero]

Run after `fatbin_prune.py LIB 90` (../shared/gpu-launch/, its directory is the first
argument: this reuses its ELF and fatbin readers). Each sm90 entry is named by the
`_INTERNAL_<hash>_<n>_<source>_cu_` symbols in its cubin (zstd-compressed entries are read
through the `zstd` command). Kept: every entry whose source is not `flash_fwd_hdim*`, and of
those, fp16 and e4m3 ones of head dims 128, 64/512 (MLA decode), 192/128 (MLA prefill) and the
`hdimdiff` files; zeroed: bf16, the `_sm80` sources, other head dims. Without `zero` it only
prints the sizes.
"""

from __future__ import annotations

import mmap
import re
import struct
import subprocess
import sys

KEEP_DIMS = {("64", "512"), ("128", None), ("192", "128"), ("diff", None)}


def keep_name(n: str) -> bool:
    if not n.startswith("flash_fwd_hdim"):
        return True
    if n.endswith("_sm80") or "bf16" in n:
        return False
    m = re.match(r"flash_fwd_hdim(\d+|diff)(?:_(\d+))?_(fp16|e4m3)_", n)
    return m is None or (m.group(1), m.group(2)) in KEEP_DIMS


def name_of(blob: bytes) -> str:
    if blob[:4] == b"(\xb5/\xfd":
        # the entry's padding after the zstd frame makes zstd exit 1 after the whole frame
        blob = subprocess.run(["zstd", "-dc"], input=blob, capture_output=True,  # noqa: S607
                              check=False).stdout
    fn = re.findall(rb"_INTERNAL_\w{8}_\d+_(\w+?)_cu_", blob)
    return fn[0].decode() if fn else "?"


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    import fatbin_prune as fp  # type: ignore[import-not-found]

    write = "zero" in sys.argv[3:]
    with open(sys.argv[2], "r+b" if write else "rb") as f:  # noqa: PTH123
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE if write else mmap.ACCESS_READ)
        off, size = fp.sections(mm)[".nv_fatbin"]
        kept = zeroed = 0
        for _c, e, _k, hs, ps, hdr in fp.entries(mm, off, size):
            if struct.unpack_from("<I", hdr, 28)[0] != 90 or not any(mm[e + hs:e + hs + 64]):
                continue
            if keep_name(name_of(bytes(mm[e + hs:e + hs + ps]))):
                kept += ps
            else:
                zeroed += ps
                if write:
                    mm[e + hs:e + hs + ps] = b"\0" * ps
        if write:
            mm.flush()
    print(f"kept {kept / 2**20:.1f} MiB, zeroed {zeroed / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
