// checkpoint/export.h — a snapshot's model as a safetensors file with GPT-2's Hugging Face
// names and layouts (transformers' GPT2Model state dict):
//   wte.weight (V, C), wpe.weight (maxT, C), h.{l}.ln_1.{weight,bias} (C),
//   h.{l}.attn.c_attn.weight (C, 3C) and .bias (3C), h.{l}.attn.c_proj.weight (C, C),
//   h.{l}.ln_2.*, h.{l}.mlp.c_fc.weight (C, 4C), h.{l}.mlp.c_proj.weight (4C, C), biases,
//   ln_f.{weight,bias}. HF's Conv1D stores weights as (in, out): troupe's (out, in) linear
//   weights are transposed. The LM head is tied to wte (GPT2LMHeadModel). All F32.
// Format (huggingface/safetensors): u64 little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {...}} padded
// with spaces to a multiple of 8, then the tensor bytes in header order.
#pragma once
#include <string>

#include "checkpoint/snapshot.h"
#include "core/config.h"

namespace troupe {

// Writes st's parameters (the model's values) to `path` (via a temporary file + rename:
// an existing file is replaced only once the new one is complete). Returns bytes written.
// Errors: Error naming the path and the fix; a failed write removes its temporary file
// (path.tmp-<pid>).
uint64_t export_safetensors(const TrainState& st, const Config& cfg, const std::string& path);

// The configuration recorded in a snapshot's manifest. Errors: UserError naming the file.
Config snapshot_config(const std::string& dir);

}  // namespace troupe
