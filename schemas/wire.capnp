# schemas/wire.capnp — the header of every data-plane message between processes
# (issue 6: UCX carries the payload; this header travels first and is checked before any
# allocation or copy; collectives/wire.h).
@0xd1e5a3b7c9f20468;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

struct TensorHeader {
  version @0 :UInt16;          # 1
  step @1 :Int64;              # training step (>= 1), validation batch (< 0), or a collective's sequence number
  microbatch @2 :Int32;
  chunk @3 :Int32;
  kind @4 :UInt8;              # 0 activation, 1 output gradient, 2 tied-embedding gradient, 3 collective, 4 inference activation, 5 memory-snapshot shard
  source @5 :Int32;            # global rank (core/topology.h)
  destination @6 :Int32;
  dtype @7 :UInt8;             # 0 f32, 1 bf16, 2 f16 (core/tensor.h DType)
  shape @8 :List(Int64);
  bytes @9 :UInt64;            # payload bytes = product(shape) * dtype size
}
