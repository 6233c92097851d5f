// actors/atoms.h — every atom of troupe's actors, declared in one place. Every actor's
// protocol, as a CAF typed actor interface: actors/interfaces.h. How each actor works and
// what it sends is written next to it:
//   actors/messages.h        one training step's protocol, end to end
//   actors/worker.h          the stage worker
//   actors/optimizer_actor.h the optimizer actor
//   actors/checkpointer.h    the checkpoint writer and the memory keeper
//   actors/data_actor.h      the data actor
//   actors/node_agent.h      the node agent (control plane between processes)
#pragma once
#include <caf/all.hpp>

namespace troupe {

// --- a step (actors/messages.h)
using batch_atom = caf::atom_constant<caf::atom("batch")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using tokens_atom = caf::atom_constant<caf::atom("tokens")>;
using targets_atom = caf::atom_constant<caf::atom("targets")>;
using act_atom = caf::atom_constant<caf::atom("act")>;
using grad_atom = caf::atom_constant<caf::atom("grad")>;
using tied_atom = caf::atom_constant<caf::atom("tied")>;
using norm_atom = caf::atom_constant<caf::atom("norm")>;
using clip_atom = caf::atom_constant<caf::atom("clip")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using infer_atom = caf::atom_constant<caf::atom("infer")>;
using logits_atom = caf::atom_constant<caf::atom("logits")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using fail_atom = caf::atom_constant<caf::atom("fail")>;
using dump_atom = caf::atom_constant<caf::atom("dump")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
// the coordinator -> a worker, once: its pipeline peers by stage (actors/worker.h)
using wire_atom = caf::atom_constant<caf::atom("wire")>;
// worker <-> its optimizer actor (actors/optimizer_actor.h)
using optimize_atom = caf::atom_constant<caf::atom("optimize")>;

// --- snapshots (actors/messages.h, actors/checkpointer.h)
using snap_atom = caf::atom_constant<caf::atom("snap")>;
using snapack_atom = caf::atom_constant<caf::atom("snapack")>;
using shard_atom = caf::atom_constant<caf::atom("shard")>;
using snapbeg_atom = caf::atom_constant<caf::atom("snapbeg")>;
using snapdone_atom = caf::atom_constant<caf::atom("snapdone")>;
using meminfo_atom = caf::atom_constant<caf::atom("meminfo")>;
using peershard_atom = caf::atom_constant<caf::atom("peershard")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;

// --- the control plane between processes (actors/node_agent.h)
using ctl_atom = caf::atom_constant<caf::atom("ctl")>;
using out_atom = caf::atom_constant<caf::atom("out")>;
using hub_atom = caf::atom_constant<caf::atom("hub")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using refuse_atom = caf::atom_constant<caf::atom("refuse")>;
using table_atom = caf::atom_constant<caf::atom("table")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using hb_atom = caf::atom_constant<caf::atom("hb")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using end_atom = caf::atom_constant<caf::atom("end")>;
using bye_atom = caf::atom_constant<caf::atom("bye")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using none_atom = caf::atom_constant<caf::atom("none")>;
using restored_atom = caf::atom_constant<caf::atom("restored")>;
using busy_atom = caf::atom_constant<caf::atom("busy")>;
using badsecret_atom = caf::atom_constant<caf::atom("badsecret")>;
using drop_atom = caf::atom_constant<caf::atom("drop")>;
using sigchk_atom = caf::atom_constant<caf::atom("sigchk")>;  // agent: forward this process's stop signal to process 0

}  // namespace troupe
