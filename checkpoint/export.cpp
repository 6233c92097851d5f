#include "checkpoint/export.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/paths.h"
#include "core/interrupt.h"
#include "model/gpt.h"
#include "schemas/snapshot.capnp.h"

namespace troupe {
namespace {

// (HF name, troupe name, transpose)
std::vector<std::tuple<std::string, std::string, bool>> hf_names(const ModelConfig& m) {
  std::vector<std::tuple<std::string, std::string, bool>> out = {{"wte.weight", "wte", false},
                                                                 {"wpe.weight", "wpe", false}};
  for (int l = 0; l < m.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    out.insert(out.end(), {{h + "ln_1.weight", h + "ln_1.weight", false},
                           {h + "ln_1.bias", h + "ln_1.bias", false},
                           {h + "attn.c_attn.weight", h + "attn.qkv.weight", true},
                           {h + "attn.c_attn.bias", h + "attn.qkv.bias", false},
                           {h + "attn.c_proj.weight", h + "attn.proj.weight", true},
                           {h + "attn.c_proj.bias", h + "attn.proj.bias", false},
                           {h + "ln_2.weight", h + "ln_2.weight", false},
                           {h + "ln_2.bias", h + "ln_2.bias", false},
                           {h + "mlp.c_fc.weight", h + "mlp.fc.weight", true},
                           {h + "mlp.c_fc.bias", h + "mlp.fc.bias", false},
                           {h + "mlp.c_proj.weight", h + "mlp.proj.weight", true},
                           {h + "mlp.c_proj.bias", h + "mlp.proj.bias", false}});
  }
  out.insert(out.end(), {{"ln_f.weight", "ln_f.weight", false}, {"ln_f.bias", "ln_f.bias", false}});
  return out;
}

}  // namespace

Config snapshot_config(const std::string& dir) {
  const std::string path = dir + "/manifest.capnp";
  std::vector<char> bytes = read_manifest(dir);
  try {
    TROUPE_USER_CHECK(!bytes.empty() && bytes.size() % sizeof(capnp::word) == 0)
        << "snapshot manifest " << path << " is damaged; use another snapshot";
    std::vector<capnp::word> words(bytes.size() / sizeof(capnp::word));
    std::memcpy(words.data(), bytes.data(), bytes.size());
    capnp::FlatArrayMessageReader reader(kj::ArrayPtr<const capnp::word>(words.data(), words.size()));
    return Config::parse(reader.getRoot<schema::Manifest>().getConfig(), path);
  } catch (const kj::Exception& e) {
    throw UserError("snapshot manifest " + path + " is damaged (" + std::string(e.getDescription().cStr()) +
                    "); use another snapshot");
  }
}

uint64_t export_safetensors(const TrainState& st, const Config& cfg, const std::string& path) {
  struct Item {
    std::string name;
    std::vector<int64_t> shape;
    Tensor data;
  };
  std::vector<Item> items;
  for (auto& [hf, ours, transpose] : hf_names(cfg.model)) {
    const Tensor& v = st.tensors.at(ours).value;
    if (!transpose) {
      items.push_back({hf, v.shape(), v});
      continue;
    }
    const int64_t rows = v.dim(0), cols = v.dim(1);
    Tensor t({cols, rows});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t.data()[c * rows + r] = v.data()[r * cols + c];
    items.push_back({hf, {cols, rows}, t});
  }
  nlohmann::ordered_json header;
  uint64_t off = 0;
  for (auto& it : items) {
    const uint64_t n = (uint64_t)it.data.nbytes();
    header[it.name] = {{"dtype", "F32"}, {"shape", it.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  header["__metadata__"] = {{"format", "pt"},
                            {"source", "troupe"},
                            {"step", std::to_string(st.step)},
                            {"n_layer", std::to_string(cfg.model.n_layer)},
                            {"n_head", std::to_string(cfg.model.n_head)},
                            {"n_embd", std::to_string(cfg.model.n_embd)},
                            {"n_positions", std::to_string(cfg.model.block_size)},
                            {"vocab_size", std::to_string(cfg.model.vocab_size)},
                            {"activation_function", "gelu_new"},
                            {"layer_norm_epsilon", "1e-5"}};
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  // a failure at any point removes the temporary file: nothing half-written stays behind
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  note_partial_file(tmp);  // a stop signal meanwhile removes it (core/interrupt.h)
  auto fail = [&](const std::string& what) {
    const int err = errno;
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    forget_partial_file(tmp);
    if (err == EFBIG)  // the file-size limit, not the disk
      throw UserError(what + " (" + std::strerror(err) + "): the export is larger than the file-size limit (ulimit -f); "
                      "raise it (ulimit -f unlimited)");
    throw UserError(what + " (" + std::strerror(err) + "); " + path_error_fix(err));
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot create " + tmp);
    const uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), (std::streamsize)h.size());
    for (auto& it : items) out.write(reinterpret_cast<const char*>(it.data.data()), (std::streamsize)it.data.nbytes());
    out.flush();
    if (!out) fail("cannot write " + tmp);
    out.close();
    if (!out) fail("cannot write " + tmp);
  }
  if (const int err = fsync_path(tmp); err != 0) {  // whole on disk before it replaces an older export
    errno = err;
    fail("cannot flush " + tmp + " to disk");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename " + tmp + " to " + path);
  forget_partial_file(tmp);
  return 8 + h.size() + off;
}

}  // namespace troupe
