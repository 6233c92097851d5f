// core/peak.h — the machine's measured peak fp32 FLOP rate, the denominator of MFU.
#pragma once

namespace troupe {

// Peak fp32 FLOP/s of `threads` cores, measured by a register-resident FMA loop with the
// widest vectors this build targets (about 50 ms). Used as the denominator of MFU
// (model FLOPs utilisation, PaLM appendix B: achieved model FLOP/s / peak FLOP/s).
double measure_peak_flops(int threads);

}  // namespace troupe
