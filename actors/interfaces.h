// actors/interfaces.h — the protocol of every troupe actor, as CAF typed actor interfaces
// (issue 15, item 5). Each entry is one message the actor takes, with its payload types;
// the comment beside it says what it means and who sends it. Atoms: actors/atoms.h; payload
// types: actors/messages.h. No message has a CAF reply: answers are separate messages
// (the "out" lines below, which are entries of the receiver's interface).
//
// What the compiler checks:
//   - every send to a handle of these types (self->send, anon_send, delayed_send): the
//     message must be one of the receiver's entries, payload types included;
//   - the event-based actors (data actor, memory keeper, node agent, tensor proxy) are
//     typed actors: their behaviors are <Iface>::behavior_type, so a handler missing from
//     the interface, or one it does not list, does not compile;
//   - the blocking actors (stage worker, optimizer actor, checkpoint writer, and the
//     coordinator, a scoped actor): CAF 0.17 has no typed blocking actors, so they keep
//     their receive loops, but each loop goes through receive_checked / check_handlers
//     below, which fails to compile unless its handlers are exactly the interface's
//     entries (system messages such as down_msg and the timeout aside).
// What it does not check: a control proxy (Cluster::control_proxy) forwards any message to
// another process, where the agent delivers it as it is to the actor it stands for; it is
// addressed through the interface of that actor (actor_cast where it is made), so what is
// sent to it is checked on this side, but what arrives on the other side is only checked
// by the receiver's handlers at run time. The same for the envelopes the agents exchange
// (their inner caf::message).
#pragma once
#include <caf/all.hpp>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "actors/messages.h"

namespace troupe {

// --- a pipeline peer: what one worker sends another (a local worker, or a tensor proxy
// that ships it over UCX to a worker in another process: actors/tensor_proxy.cpp)
using PipelinePeer = caf::typed_actor<
    // F: the activation of microbatch mb for the receiving chunk (virtual stage v-1 -> v)
    caf::reacts_to<act_atom, int64_t /*k*/, int /*mb*/, int /*chunk*/, Tensor /*(B,T,C)*/>,
    // B: the gradient of microbatch mb for the receiving chunk (virtual stage v+1 -> v)
    caf::reacts_to<grad_atom, int64_t /*k*/, int /*mb*/, int /*chunk*/, Tensor /*(B,T,C)*/>,
    // first <-> last stage: the other side's tied wte gradient (fp32), sent after the
    // sender's last backward action on that chunk
    caf::reacts_to<tied_atom, int64_t /*k*/, Tensor /*(V,C)*/>,
    // inference: the forward pass of request `id` between virtual stages
    caf::reacts_to<infer_atom, int64_t /*id*/, int /*chunk*/, Tensor>,
    // coordinator (shutdown): exits (a tensor proxy ignores it: the Cluster ends it)
    caf::reacts_to<stop_atom>>;

// --- the stage worker (actors/worker.h; blocking: Worker::receive_one)
using WorkerActor = PipelinePeer::extend<
    // coordinator, once and first: the workers of its (dp, tp) by stage
    caf::reacts_to<wire_atom, std::vector<PipelinePeer>>,
    // data actor -> the first stage: microbatch mb's input tokens
    caf::reacts_to<tokens_atom, int64_t /*k*/, int /*mb*/, TokenBlock>,
    // data actor -> the last stage: microbatch mb's targets (TokenBlock::dloss set)
    caf::reacts_to<targets_atom, int64_t /*k*/, int /*mb*/, TokenBlock>,
    // coordinator: run step k (kind 0 train, 1 eval) with this loss scale (fp16; else 1)
    caf::reacts_to<step_atom, int64_t /*k*/, int /*kind*/, double /*loss_scale*/>,
    // coordinator -> stage 0: a forward pass to sample from
    caf::reacts_to<infer_atom, int64_t /*id*/, TokenBlock>,
    // coordinator: answer (dump_atom, ParamDump) to the coordinator
    caf::reacts_to<dump_atom>,
    // coordinator: a snapshot of step k (kSnapDisk | kSnapMemory); the worker hands its
    // state to its optimizer actor (snap_atom, k, where, ShardData)
    caf::reacts_to<snap_atom, int64_t /*k*/, int32_t /*where*/>,
    // coordinator: an in-place recovery's state, before step 1
    caf::reacts_to<restore_atom, RestoreState>,
    // coordinator (diagnosis): answer (status_atom, WaitState) to the coordinator
    caf::reacts_to<status_atom>>;

// --- the optimizer actor (actors/optimizer_actor.h; blocking: OptimizerActor::receive_one)
using OptimizerActor = caf::typed_actor<
    // its worker, the step's gradients complete: reduce, then (norm_atom) to the coordinator
    caf::reacts_to<optimize_atom, int64_t /*k*/, StepReport>,
    // coordinator: the clip decision; AdamW unless skip; then (done_atom) to the coordinator
    caf::reacts_to<clip_atom, int64_t /*k*/, float /*clip_scale*/, double /*lr*/, bool /*skip*/>,
    // its worker: its value records; this adds master weights and moments and sends
    // (shard_atom) to the writer and/or the keeper, (snapack_atom) to the coordinator
    caf::reacts_to<snap_atom, int64_t /*k*/, int32_t /*where*/, ShardData>,
    // coordinator: an in-place recovery's state
    caf::reacts_to<restore_atom, RestoreState>,
    // coordinator: exits
    caf::reacts_to<stop_atom>>;

// --- the checkpoint writer (actors/checkpointer.h; blocking: checkpoint_writer), process 0
using WriterActor = caf::typed_actor<
    // every optimizer actor (other processes: through a control proxy): one shard
    caf::reacts_to<shard_atom, int64_t /*k*/, ShardData>,
    // coordinator: the manifest of step k, how many shards, the checkpoint directory;
    // answered by (snapdone_atom, k, SnapDone) once written (or failed)
    caf::reacts_to<snapbeg_atom, int64_t /*k*/, ManifestInfo, int /*workers*/, std::string /*directory*/>,
    // coordinator: ends it
    caf::reacts_to<stop_atom>>;

// --- the memory keeper of one process (actors/checkpointer.h; event-based, detached)
using KeeperActor = caf::typed_actor<
    // this process's optimizer actors: kept, and an encoded copy sent to process p + 1
    caf::reacts_to<shard_atom, int64_t /*k*/, ShardData>,
    // the data plane (Cluster::deliver_snapshots_to): process p - 1's encoded copy of rank r
    caf::reacts_to<peershard_atom, int64_t /*k*/, int32_t /*rank*/, Tensor>,
    // coordinator (process 0, through a control proxy elsewhere): step k's counters
    caf::reacts_to<meminfo_atom, int64_t /*k*/, int64_t /*updates*/, uint64_t /*loss-scale bits*/,
                   int32_t /*growth tracker*/, int32_t /*hysteresis tracker*/>,
    // coordinator: ends it
    caf::reacts_to<stop_atom>>;

// --- the data actor of one process (actors/data_actor.h; event-based)
using DataActor = caf::typed_actor<
    // coordinator: global batch `index` of split `kind` (0 train, 1 + s validation source s)
    // for step k: (tokens_atom) to the first stages, (targets_atom) to the last
    caf::reacts_to<batch_atom, int64_t /*k*/, int /*kind*/, int64_t /*index*/>,
    // coordinator: quits
    caf::reacts_to<stop_atom>>;

// --- the coordinator (actors/coordinator.h; a scoped actor: Coordinator::wait). Other
// processes reach it through a control proxy.
using CoordinatorActor = caf::typed_actor<
    // an optimizer actor: step k's per-tensor sums of squares and found-inf
    caf::reacts_to<norm_atom, int64_t /*k*/, NormReport>,
    // an optimizer actor (training) or a worker (evaluation): step k's end
    caf::reacts_to<done_atom, int64_t /*k*/, StepReport>,
    // the last stage: the logits (V) of inference request `id`
    caf::reacts_to<logits_atom, int64_t /*id*/, Tensor>,
    // a worker, answering (dump_atom): its parameters
    caf::reacts_to<dump_atom, ParamDump>,
    // an optimizer actor: its state of step k's snapshot is handed on
    caf::reacts_to<snapack_atom, int64_t /*k*/, SnapAck>,
    // the writer: step k's snapshot is on disk (or failed)
    caf::reacts_to<snapdone_atom, int64_t /*k*/, SnapDone>,
    // a worker: what it waits for (asked by (status_atom), or sent when a wait times out)
    caf::reacts_to<status_atom, WaitState>,
    // a worker, optimizer actor, data actor (stage -1), tensor proxy or the Cluster (-2, a
    // lost process): a failure; the sender (but the Cluster) has exited
    caf::reacts_to<fail_atom, int /*stage*/, std::string /*message*/>>;

// --- the node agent (actors/node_agent.h; stateful event-based). The hub is published
// untyped (CAF checks a typed interface at remote_actor, and joiners connect untyped).
using NodeAgentActor = caf::typed_actor<
    // its Cluster (not the hub): the hub's handle, then this process's join is sent to it
    caf::reacts_to<hub_atom, caf::actor /*hub*/, caf::message /*join*/>,
    // a local control proxy: a message for actor (kind, index) of process proc
    caf::reacts_to<out_atom, int32_t /*proc*/, int32_t /*kind*/, int32_t /*index*/, caf::message>,
    // another process's agent: an authenticated envelope
    caf::reacts_to<ctl_atom, int32_t /*from*/, int32_t /*to*/, uint64_t /*seq*/, std::vector<char> /*body*/,
                   std::vector<char> /*mac*/>,
    // the hub, outside envelopes: this process's tag failed (quoting it)
    caf::reacts_to<badsecret_atom, std::vector<char> /*mac*/>,
    // itself (hub), 2 s after badsecret: close that stranger's connection
    caf::reacts_to<drop_atom, caf::node_id>,
    // itself, every fault.heartbeat_s: heartbeats out, silence in
    caf::reacts_to<tick_atom>,
    // itself (not the hub), every 0.2 s: forward this process's stop signal to process 0
    caf::reacts_to<sigchk_atom>,
    // its Cluster: tell every live peer that the job fails
    caf::reacts_to<abort_atom, std::string /*why*/>,
    // its Cluster: an agents'-protocol message for process proc
    caf::reacts_to<none_atom, int32_t /*proc*/, caf::message>>;

// --- compile-time checks of a blocking actor's receive loop
namespace interface_detail {
// system messages (handled beside an interface, never part of it)
template <class Mpi>
struct is_system : std::false_type {};
template <class Out>
struct is_system<caf::typed_mpi<caf::detail::type_list<caf::down_msg>, Out>> : std::true_type {};
template <class Out>
struct is_system<caf::typed_mpi<caf::detail::type_list<caf::exit_msg>, Out>> : std::true_type {};
}  // namespace interface_detail

// Fails to compile unless the handlers `fs` (message handlers, system-message handlers,
// and a timeout last) handle exactly Iface's messages: none missing, none extra, payload
// types as listed. The same check as a typed behavior's (caf::interface_mismatch_t).
template <class Iface, class... Fs>
void check_handlers(const Fs&...) {
  using found = caf::detail::tl_filter_not_t<caf::detail::type_list<caf::deduce_mpi_t<Fs>...>,
                                             interface_detail::is_system>;
  using m = caf::interface_mismatch_t<found, typename Iface::signatures>;
  caf::detail::static_error_printer<(int)caf::detail::tl_size<found>::value, m::value, typename m::xs,
                                    typename m::ys>
      guard;
  CAF_IGNORE_UNUSED(guard);
}

// A blocking actor's receive of one message, its handlers checked against Iface.
template <class Iface, class... Fs>
void receive_checked(caf::blocking_actor* self, Fs&&... fs) {
  check_handlers<Iface>(fs...);
  self->receive(std::forward<Fs>(fs)...);
}

}  // namespace troupe
