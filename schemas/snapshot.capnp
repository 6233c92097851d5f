# schemas/snapshot.capnp — the manifest of a troupe snapshot (checkpoint/snapshot.h).
# A snapshot is a directory of shard files (one per worker) and this manifest, written
# last and atomically: a directory without a valid manifest is not a snapshot.
@0xc3c2a1f4d6e8b901;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

struct Manifest {
  formatVersion @0 :UInt32;        # 1
  step @1 :Int64;                  # the last completed step (resume continues at step + 1)
  updates @2 :Int64;               # AdamW updates applied (skipped fp16 steps do not count)
  config @3 :Text;                 # the resolved configuration (TOML) of the run that saved it
  layout @4 :Layout;
  precision @5 :Text;              # fp32 | bf16 | fp16
  lossScaler @6 :LossScaler;
  tokenizerHash @7 :Text;          # identity of the tokenizer the run used ("" if none)
  versions @8 :Text;               # troupe and library versions of the writer
  tensors @9 :List(TensorInfo);    # every logical tensor, canonical order
  files @10 :List(FileInfo);       # every shard file, with its size and checksum
  dataPosition @11 :Int64;         # the next training batch index (= step + 1: stateless loader)
  rngState @12 :Text;              # RNG state: the seed (all randomness is keyed by seed, step, position)
}

struct Layout {
  tp @0 :Int32;
  pp @1 :Int32;
  dp @2 :Int32;
  chunks @3 :Int32;
}

struct LossScaler {
  scale @0 :Float64;
  growthTracker @1 :Int32;
  hysteresisTracker @2 :Int32;
}

struct TensorInfo {
  name @0 :Text;
  shape @1 :List(Int64);           # the logical (unsharded) shape
  shard @2 :Text;                  # how TP splits it: replicated | rows | cols | qkv_rows | vocab_rows
}

struct FileInfo {
  name @0 :Text;                   # relative to the snapshot directory
  bytes @1 :UInt64;
  crc32 @2 :UInt32;                # zlib crc32 of the whole file
}
