"""Energy costs of an Adreno target: picojoules per byte of DRAM traffic and per FLOP of the GPU.

``python -m torch_adreno project`` multiplies a projected step's bytes and FLOPs by these figures
(:func:`project_energy`). None of them was measured by this project (it has never run on a phone):
each is a published figure or an estimate whose derivation is written beside it, in
:data:`DRAM_PJ_PER_BYTE`, :data:`GPU_PJ_PER_FLOP` and :data:`SOC_MEMORY`, with the documents in
:data:`ENERGY_SOURCES`. The figures are coarse (a factor of two either way would not surprise):
they are for comparing steps and targets, not for predicting a battery's life.

What the projection counts, per step:

- **DRAM**: every byte a kernel reads or writes in global memory is taken as a DRAM access (the
  GPU's caches are not modelled: an upper bound for kernels whose working set fits in them);
- **copies**: a host<->device copy on a phone's unified memory reads and writes DRAM, 2 x its bytes
  (as the step-time projection counts it);
- **arithmetic**: FLOPs x the GPU's energy per FLOP at the precision the kernels compute in (fp32
  registers unless ``native_half``);
- **static power**: not included. No public figure for an Adreno's idle or leakage power was
  found; the GPU figures below come from whole-SoC power under load, so part of the static power
  is inside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Documents the energy figures cite, by short name.
ENERGY_SOURCES = {
    "accelergy-dram": "https://github.com/Accelergy-Project/hwcomponents-cacti (hwcomponents_cacti.py, DRAM "
                      "energy per bit by type: LPDDR4 8 pJ/bit, HBM2 3.9, GDDR5 14, DDR3 70)",
    "samsung-lpddr5": "https://simmtester.com/News/IndustryArticle/20928 (JEDEC LPDDR5, JESD209-5, 2019: 'Samsung "
                      "previously estimated that LPDDR5 modules offer as much as 30-percent lower power consumption "
                      "compared to RAM solutions based on the LPDDR4X standard')",
    "micron-lpddr5x": "https://whychips.com/micron-lpddr5x-next-gen-mobile-memory (Micron LPDDR5X: '20% better "
                      "efficiency than LPDDR5'); Micron's 1-gamma LPDDR5X: 'up to 20% power savings' "
                      "(https://www.newelectronics.co.uk/content/product-launches/"
                      "micron-shipping-world-s-first-1-gamma-based-lpddr5x)",
    "horowitz-2014": "M. Horowitz, 'Computing's energy problem (and what we can do about it)', ISSCC 2014: a 32-bit "
                     "DRAM read 640 pJ (20 pJ/bit, DDR3 at 45 nm); an upper reference for the LPDDR figures",
    "golden-740": "https://mixzhare.com/technology/mobile/snapdragon-8-gen-2-vs-a16-bionic-vs-dimensity-9200-"
                  "qualcomms-adreno-740-wins-the-gpu-race-in-style/ and https://notebookcheck.com/GPU-des-"
                  "Snapdragon-8-Gen-2-uebertrifft-Performance-und-Effizienz-des-Apple-A16-Bionic-im-iPhone-14-Pro."
                  "676270.0.html (Golden Reviewer's measurements: Snapdragon 8 Gen 2 SoC power 7.3-7.6 W in GPU "
                  "benchmarks, 7.5 W in 3DMark Wild Life Extreme)",
    "qualcomm-750": "https://trendgrnd.com/qualcomms-snapdragon-8-gen-3-infuses-high-performance-ai-for-upcoming-"
                    "flagship-smartphones/ (Qualcomm, Snapdragon 8 Gen 3: 'Adreno GPU: 25% performance and 25% "
                    "power efficiency improvements' over the 8 Gen 2)",
    "profiles": "torch_adreno/targets/profiles.py: each target's bandwidth_gbs source names its memory type",
}

#: Picojoules per byte of DRAM access (read or write), by memory type, with how each was got.
DRAM_PJ_PER_BYTE: dict[str, tuple[float, str]] = {
    "LPDDR4X": (64.0, "estimate: accelergy-dram's LPDDR4 8 pJ/bit x 8 bits; LPDDR4X lowers only the I/O "
                      "voltage, so LPDDR4's figure is kept (an upper end)"),
    "LPDDR5": (44.8, "estimate: the LPDDR4X figure (64 pJ/byte) x 0.7, samsung-lpddr5's 30% lower power than "
                     "LPDDR4X (taken per byte moved) = 5.6 pJ/bit"),
    "LPDDR5X": (35.84, "estimate: the LPDDR5 figure (44.8 pJ/byte) x 0.8, micron-lpddr5x's 20% better efficiency "
                       "than LPDDR5 = 4.48 pJ/bit"),
}

#: The memory each SoC of a target profile uses (the bandwidth its profile takes is that memory's).
SOC_MEMORY: dict[str, tuple[str, str]] = {
    "Snapdragon 855": ("LPDDR4X", "profiles (adreno640: LPDDR4X-4266)"),
    "Snapdragon 865": ("LPDDR5", "profiles (adreno650: LPDDR5-5500; the SoC also takes LPDDR4X)"),
    "Snapdragon 888": ("LPDDR5", "profiles (adreno660: LPDDR5-6400)"),
    "Snapdragon 8 Gen 1": ("LPDDR5", "profiles (adreno730: LPDDR5-6400)"),
    "Snapdragon 8 Gen 2": ("LPDDR5X", "profiles (adreno740: LPDDR5X-4200, 8.4 Gb/s)"),
    "Snapdragon 8 Gen 3": ("LPDDR5X", "profiles (adreno750: LPDDR5X-4800, 9.6 Gb/s)"),
    "Snapdragon 8 Elite": ("LPDDR5X", "profiles (adreno830: LPDDR5X-5300, 10.6 Gb/s)"),
}

_740_FP32 = 7.5 / 3.7  # W over TFLOP/s = pJ per FLOP
_750_FP32 = _740_FP32 * 0.8
_FROM_740 = ("estimate: the Adreno 740's figure ({:.2f} pJ/FLOP); no power figure found for this GPU (an older "
             "process node than the 740's 4 nm: likely an underestimate)")

#: Picojoules per fp32 FLOP of each GPU, with how it was got. fp16 is taken as half (see
#: :data:`FP16_PER_FP32`).
GPU_PJ_PER_FLOP: dict[str, tuple[float, str]] = {
    "Adreno 740": (_740_FP32, f"estimate: golden-740's 7.5 W of SoC power in GPU benchmarks over the 740's "
                              f"3.7 TFLOP/s fp32 peak = {_740_FP32:.2f} pJ/FLOP; whole-SoC power (memory, fabric "
                              "and static power included) at a graphics load, not an ALU's energy"),
    "Adreno 750": (_750_FP32, f"estimate: the Adreno 740's {_740_FP32:.2f} pJ/FLOP x 0.8, qualcomm-750's 25% "
                              f"better power efficiency (performance per watt: energy per FLOP / 1.25) = "
                              f"{_750_FP32:.2f}"),
    "Adreno 830": (_750_FP32, f"estimate: the Adreno 750's {_750_FP32:.2f} pJ/FLOP; no power figure found for the "
                              "830 (a newer node: likely an overestimate)"),
    "Adreno 640": (_740_FP32, _FROM_740.format(_740_FP32)),
    "Adreno 650": (_740_FP32, _FROM_740.format(_740_FP32)),
    "Adreno 660": (_740_FP32, _FROM_740.format(_740_FP32)),
    "Adreno 730": (_740_FP32, _FROM_740.format(_740_FP32)),
}

#: fp16 energy per FLOP over fp32's: packed half ALUs do two fp16 FLOPs where fp32 does one, at
#: about one fp32 operation's energy (the profiles' fp16 peak is twice the fp32 peak for the same
#: reason). An estimate.
FP16_PER_FP32 = 0.5
FP16_SOURCE = ("estimate: half the fp32 figure (packed half ALUs: twice the FLOPs per operation; qcom-guide of "
               "torch_adreno.targets.profiles.SOURCES)")

ARITHMETIC = ("fp32", "fp16")


@dataclass(frozen=True)
class EnergyCosts:
    """A target's energy figures: ``pj_per_byte`` of DRAM access, ``pj_per_flop`` by arithmetic
    precision ("fp32", "fp16"), each with its source in ``sources``; no static power (see the module
    docstring)."""

    target: str
    memory: str
    pj_per_byte: float
    pj_per_flop: dict[str, float]
    sources: dict[str, str] = field(default_factory=dict, compare=False)


def energy_costs(target: Any) -> EnergyCosts:
    """The energy figures of an :class:`~torch_adreno.targets.profiles.AdrenoTarget` (found by its SoC
    and GPU, so a profile derived from a named one keeps them); ValueError for a target of neither."""
    memory = SOC_MEMORY.get(target.soc)
    gpu = GPU_PJ_PER_FLOP.get(target.gpu)
    if memory is None or gpu is None:
        raise ValueError(f"no energy figures for target {target.name!r} ({target.gpu}, {target.soc}): energy is "
                         f"projected for the GPUs {', '.join(sorted(GPU_PJ_PER_FLOP))} of the SoCs "
                         f"{', '.join(sorted(SOC_MEMORY))}")
    kind, memory_source = memory
    per_byte, byte_source = DRAM_PJ_PER_BYTE[kind]
    fp32, flop_source = gpu
    return EnergyCosts(
        target=target.name, memory=kind, pj_per_byte=per_byte,
        pj_per_flop={"fp32": fp32, "fp16": fp32 * FP16_PER_FP32},
        sources={"memory": memory_source, "pj_per_byte": byte_source, "pj_per_flop_fp32": flop_source,
                 "pj_per_flop_fp16": FP16_SOURCE,
                 "static_power": "not included: no public figure for an Adreno's idle power found"})


@dataclass(frozen=True)
class StepEnergy:
    """A step's projected energy in joules, by where it goes; ``total_joules`` is their sum."""

    dram_joules: float
    copy_joules: float
    arithmetic_joules: float
    arithmetic: str

    @property
    def total_joules(self) -> float:
        return self.dram_joules + self.copy_joules + self.arithmetic_joules


def project_energy(costs: EnergyCosts, kernel_bytes: float, copied_bytes: float, flops: float,
                   arithmetic: str = "fp32") -> StepEnergy:
    """The energy of a step whose kernels move ``kernel_bytes`` of global memory and compute ``flops``
    in ``arithmetic`` ("fp32" or "fp16"), and which copies ``copied_bytes`` between host and device
    (each copied byte read and written in DRAM)."""
    if arithmetic not in costs.pj_per_flop:
        raise ValueError(f"arithmetic must be one of {', '.join(ARITHMETIC)}, got {arithmetic!r}")
    if min(kernel_bytes, copied_bytes, flops) < 0:
        raise ValueError(f"bytes and FLOPs must be >= 0, got {kernel_bytes}, {copied_bytes}, {flops}")
    pj = 1e-12
    return StepEnergy(dram_joules=kernel_bytes * costs.pj_per_byte * pj,
                      copy_joules=2 * copied_bytes * costs.pj_per_byte * pj,
                      arithmetic_joules=flops * costs.pj_per_flop[arithmetic] * pj, arithmetic=arithmetic)
