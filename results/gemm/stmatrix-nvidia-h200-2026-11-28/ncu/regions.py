#!/usr/bin/env python3
"""Warp-stall samples of an `ncu --page source --csv --print-source sass` listing, summed by
region of the GEMM kernel. Regions are SASS offsets from the kernel's first instruction, read off
the listing (main loop: the HGMMA loop up to its WARPGROUP.DEPBAR 0x0; the tile calculation up to
the epilogue's first store; the epilogue; the loader from its UTMALDG region on).
    python3 regions.py source-….csv.gz MAIN_START MAIN_END EPI_START EPI_END LOADER_START"""
import collections, csv, gzip, sys

path, *cuts = sys.argv[1:]
main0, main1, epi0, epi1, loader0 = (int(c, 16) for c in cuts)
rows = list(csv.reader(gzip.open(path, "rt")))
hdr, data = rows[1], rows[2:]
addr, src = hdr.index("Address"), hdr.index("Source")
smp = hdr.index("Warp Stall Sampling (All Samples)")
base = int(data[0][addr], 16)
regions = [("set-up", 0, main0), ("main loop", main0, main1), ("tile calculation", main1, epi0),
           ("epilogue", epi0, epi1), ("rest of the consumers", epi1, loader0), ("loader, exit", loader0, 1 << 40)]
total = sum(float(r[smp] or 0) for r in data)
for name, lo, hi in regions:
    s = sum(float(r[smp] or 0) for r in data if lo <= int(r[addr], 16) - base < hi)
    print(f"{name:24s} {100 * s / total:5.1f} %")
ex = hdr.index("Instructions Executed")
warp_tiles = 8 * (4096 // 128) * (8192 // 256)  # consumer warps x tiles at 4096 x 8192, 128 x 256 tiles
epi_ex = sum(int(r[ex] or 0) for r in data if epi0 <= int(r[addr], 16) - base < epi1)
epi_smp = sum(float(r[smp] or 0) for r in data if epi0 <= int(r[addr], 16) - base < epi1)
print(f"epilogue: {epi_ex / warp_tiles:.0f} instructions executed per consumer warp and tile, {epi_smp:.0f} samples")
reasons = collections.Counter()
for r in data:
    if epi0 <= int(r[addr], 16) - base < epi1:
        for i, h in enumerate(hdr):
            if h.startswith("stall_") and "Not Issued" not in h and r[i]:
                reasons[h] += float(r[i])
print("epilogue's stall reasons:", ", ".join(f"{k} {v:.0f}" for k, v in reasons.most_common(5)))
