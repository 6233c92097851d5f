// actors/node_agent.h — the protocol of the node agent: one per process of a job of several
// processes, the network side of its Cluster (actors/cluster.h; state in
// actors/cluster_impl.h, code in actors/node_agent.cpp). Process 0's agent is the hub.
//
// Between agents every message is an envelope
//   (ctl_atom, int32_t from, int32_t to, uint64_t seq, vector<char> body, vector<char> mac)
// body = CAF-serialized (int32_t kind, int32_t index, caf::message inner), mac =
// HMAC-SHA256(secret; from, to, seq, body), seq > the last accepted from that process.
// kind >= 0 (RemoteRef::Kind): `inner` is delivered as it is to the local actor exposed
// as (kind, index). kind -1: the agents' own protocol, `inner` one of
//   (join_atom, rank, world, binary sha256, config toml, UCX address, host, pid, resume,
//        memory offer vector<int64_t>, tokenizer hash)    joiner -> hub, its first message
//   (refuse_atom, string why)                             hub -> joiner: refused (also sent
//                                                          outside the sequence to a second
//                                                          claimant of a rank)
//   (busy_atom)                                           hub -> a recovering joiner: the
//                                                          failed start is still ending; retry
//   (table_atom, addresses, source, step, provider, hosts, pids)  hub -> all: the process
//                                                          table and the recovery plan
//   (ready_atom) / (restored_atom) / (bye_atom)           -> hub: transport connected /
//                                                          state handed over / done
//   (end_atom)                                            hub -> all: the job ended
//   (hb_atom)                                             heartbeat, every fault.heartbeat_s
//   (abort_atom, string why)                              the job fails everywhere
// Outside envelopes:
//   (badsecret_atom, vector<char> mac)   hub -> a sender whose tag failed (quoting it)
// From its own process (local only; these, the envelope and badsecret_atom are its
// interface, NodeAgentActor in actors/interfaces.h: a typed stateful actor):
//   (hub_atom, actor hub, caf::message join)   the hub's handle, then the join is sent
//   (out_atom, int32_t proc, int32_t kind, int32_t index, caf::message)  a control proxy's
//        message for actor (kind, index) of process proc
//   (none_atom, int32_t proc, caf::message)    an agents'-protocol message for proc
//   (abort_atom, string why)                   tell every live peer
//   (tick_atom)                                heartbeats out, silence in (a peer silent
//                                              for fault.timeout_s is lost)
//   (drop_atom, caf::node_id)                  close the connection of a told stranger
// A lost peer (connection closed, heartbeats silent) fails the Cluster (Impl::fail); the
// hub also tells every other agent to abort. No message has a reply.
#pragma once
