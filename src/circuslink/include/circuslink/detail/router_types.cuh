// circuslink/detail/router_types.cuh - what a forwarding agent serves (plain structs; docs/routing.md, "Forwarding").
//
// The host's tables of these structs are circuslink.channels.protocol (ROUTER_INPUT, ROUTER_OUTPUT,
// ROUTER_CHANNEL, ROUTER_STATE, ROUTER_AGENT); tests/test_abi.py checks them against this file with nvcc.
// The host builds them per rank (channels/_routed.py: RouterPlan.agent) from the routing tables; the agent
// (detail/router_impl.cuh) and its cpu reference (channels/_router_cpu.py) follow the same rules.
#pragma once

#include "route_types.cuh"

namespace circuslink {
namespace router {

enum : unsigned int {
  // the routed header: nbytes word = nbytes | kind (bit 31) | ctrl (bit 28) | vc << 24 (docs/routing.md)
  kVcShift = 24,
  kVcMask = 0x0F000000u,
  kCtrl = 0x10000000u,        // a credit packet (agents' own), payload: the consumed count (u64)
  kNbytesMask = 0x00FFFFFFu,
  kCreditBytes = 8,
  // inputs and channels
  kInLink = 0,                // a link ring (link, vc), fed by the neighbour behind a port
  kInInject = 1,              // a routed channel's injection ring, fed by its sender
  kRoleFirst = 1,             // this rank drains the channel's injection ring and holds its gate
  kRoleLast = 2,              // this rank writes the channel's delivery ring and reads its board
  kNoChannel = 0xFFFFu,
  // chain records (what an input's head waits on): 64 words
  kChainWords = 64,
  kChainHead = 4,             // count, flags, detail (packet seq), cycle start + 1
  kChainEntries = 60,
  kChainBlocked = 1,
  kChainGate = 2,
  kChainDelivery = 4,
  kEntryChannel = 0x80000000u,  // an entry naming a channel's injection ring
  // control words (host-mapped): stop (host writes), state (agent: 1 running, 2 exited), error record
  kCtlStop = 0,
  kCtlState = 1,
  kCtlError = 2,              // code
  kCtlInput = 3,              // the input it concerns
  kCtlSeq = 4,                // packet seq (low 32 bits)
  kCtlWord = 5,               // the header word, or the channel id
  kCtlYield = 6,              // host writes: store the state and end this launch (a device-wide sync waits)
  kCtlWords = 8,
  // error codes
  kErrNone = 0,
  kErrHeader = 1,             // a corrupt header
  kErrChannel = 2,            // a packet for a channel this rank does not deliver / gate
  kErrNoLink = 3,             // no link out toward the destination
  kErrUnits = 4,              // a low-latency packet's header arrived, its data did not (time-out)
  kErrAborted = 5,            // the host's abort word was set
  kErrCopy = 6,               // a bulk copy job did not complete (a copy block never ran) within the time-out
  // Output::kind: how a hop reaches the next agent, whatever transport carries it
  kHopMapped = 0,             // a link ring in the neighbour's mapped memory: the agent may deliver there
  kHopRelay = 1,              // the out ring of this gateway's relay: a transport carries it, the landing agent delivers
  // Agent::flags
  kAgentGpuScope = 1,         // every rank shares this GPU (channels.shares_one_gpu): bulk fences at .gpu, not .sys
  kNoInput = 0xFFFFFFFFu,     // Channel::arrival where this rank does not deliver the channel
  // the routing block's dynamic shared memory per input, output and rank (router_impl.cuh: InS, OutS, the hop
  // table; channels/protocol.py: ROUTER_SHARED_PER_*)
  kSharedPerInput = 168,
  kSharedPerOutput = 16,
  kSharedPerRank = 4,
};

// One input ring of this rank's agent (64 bytes). The in ring of a gateway's relay is an input like a link ring
// (kInLink, the network port's VC 0), wherever its transport keeps it: the transport writes the packets and reads
// the consumed count back from `credit`.
struct Input {
  unsigned char* ring;            // in this rank's memory (or its relay's in ring)
  unsigned long long* credit;     // the writer's in-order credit counter (a neighbour's memory; relay: its own)
  unsigned int* slot_credit;      // injection rings: the sender's slot credits; link rings: null
  unsigned int* chain;            // this input's chain record (this rank's memory)
  unsigned int nslots;            // power of two
  unsigned int slot_bytes;        // 256 + chunk
  unsigned int chunk;
  unsigned int kind;              // kInLink / kInInject
  unsigned int channel;           // kInInject: routed channel index; kInLink: kNoChannel
  unsigned int entry;             // the chain entry naming this input
  unsigned int pad0, pad1;
};

// One output, index port * vcs + vc (48 bytes); ring null where the port has no link out. On a port whose
// link joins two nodes (route::LINK_NETWORK) output (port, 0) is the gateway's relay: its out ring, whose
// consumed count the transport returns as its sends complete (docs/scale.md).
struct Output {
  unsigned char* ring;            // the link ring at the neighbour, or the relay's out ring
  unsigned long long* credit;     // consumed count, written by the downstream agent (relay: by the transport)
  const unsigned int* down_chain; // the downstream agent's chain record of that ring (relay: an empty one)
  unsigned int nslots;
  unsigned int slot_bytes;
  unsigned int entry;             // the chain entry naming this ring
  unsigned int kind;              // kHopMapped or kHopRelay
};

// A routed channel as this rank's agent sees it (40 bytes); role 0 where this rank has none.
struct Channel {
  unsigned char* ring;            // kRoleLast: the delivery ring, in the receiver's memory
  const unsigned int* board;      // kRoleLast: the receiver's slot credits, in this rank's memory
  unsigned int nslots;
  unsigned int slot_bytes;
  unsigned int route;             // recv_id | dst << 16
  unsigned int role;              // kRoleFirst | kRoleLast
  unsigned int first;             // the rank holding its gate (credit packets go there)
  unsigned int arrival;           // kRoleLast: the input its packets arrive on (the warp of that input alone
                                  // delivers the channel); kNoInput otherwise
};

// The agent's state per routed channel (device memory, zeroed by the host).
// Written by one warp each: delivered by the warp of the arrival input; consumed and reported by the keeper warp
// (first elsewhere: it sends the credit packets) or the warp of the injection ring (first == last); gate by the
// warp the credit packets arrive on (or, first == last, the injection ring's). Read across warps: volatile.
struct ChannelState {
  unsigned long long delivered;   // kRoleLast: packets written into the delivery ring
  unsigned long long consumed;    // kRoleLast: the receiver's in-order consumed count, scanned from the board
  unsigned long long reported;    // kRoleLast (first elsewhere): the count last sent to first
  unsigned long long gate;        // kRoleFirst: the receiver's consumed count as known here
};

// What an agent keeps of each input and output from one launch to the next (device memory, zeroed by the
// host): the agent stays resident for the job, but ends its launch when the host asks (kCtlYield: a
// device-wide synchronization of this process is waiting) or after slice_ns (a bound for synchronizations the
// host does not see), and the host launches it again at once (backends/_resident.py).
struct InputState {
  unsigned long long seq;         // next packet to take
  unsigned long long since;       // %globaltimer when its head last became blocked
  unsigned int blocked;           // what it waits for (router_impl.cuh: kBlk*), 0: nothing
  unsigned int published;         // its chain record is published
};
struct OutputState {
  unsigned long long seq;         // next slot to write
  unsigned long long cache;       // the downstream consumed count last read
};

// A bulk packet handed to the copy blocks (device memory, 64 bytes): ticket t lives in jobs[t % njobs] and is
// copied by copy block 1 + t % ncopy. `posted` and `done` hold ticket + 1, so a slot's previous occupant never
// looks like the current one.
struct Job {
  const unsigned char* src;       // the input slot
  unsigned char* dst;             // the output (or delivery) slot
  unsigned long long posted;      // ticket + 1 once the fields below are written (the router block)
  unsigned long long done;        // ticket + 1 once the payload is copied and the header published (a copy block)
  unsigned int nb;
  unsigned int route;
  unsigned int word;
  unsigned int flag;
  unsigned int rewrite;           // a rewrite lap: the copy block re-flags the slot's low-latency units too
  unsigned int pad0, pad1, pad2;
};

// The copy blocks' shared counters (device memory, zeroed by the host; kept from one launch to the next).
struct CopyState {
  unsigned long long next;        // the first ticket of the next launch (the router block stores it at its end)
  unsigned int launches;          // launches ended: a copy block leaves when it moves past the count it started with
  unsigned int arrived;           // copy blocks started, over all launches (the router block waits for its ncopy)
  unsigned int dead;              // the agent failed: copy blocks leave at once
  unsigned int pad0, pad1, pad2;
};

// What the agent kernel receives, by value (176 bytes).
struct Agent {
  const Input* inputs;
  const Output* outputs;          // nports * vcs
  const Channel* channels;
  ChannelState* state;
  InputState* input_state;        // ninputs
  OutputState* output_state;      // noutputs
  const route::Entry* entries;    // this rank's row of the routing table (nranks)
  const unsigned short* channel_of_id;  // recv_id -> routed channel index (kNoChannel: none)
  const unsigned int* reporters;  // the channels this rank delivers whose gate is elsewhere (credit reports)
  unsigned int* control;          // host-mapped control words (kCtl*)
  const volatile unsigned int* abort;   // the back-end's abort word (host-mapped)
  unsigned long long timeout_ns;  // a low-latency packet's data may lag its header this long
  unsigned long long report_after_ns;  // a head blocked this long gets its chain published
  unsigned long long slice_ns;    // a launch ends after this long at most (0: only when the host asks)
  Job* jobs;                      // njobs bulk copy jobs
  CopyState* copy;
  unsigned int njobs;             // a multiple of ncopy (0 when ncopy is 0)
  unsigned int ncopy;             // copy blocks (blocks 1..ncopy of the grid); 0: the routing warps copy themselves
  unsigned int flags;             // kAgent*
  unsigned int pad;
  unsigned int ninputs;
  unsigned int noutputs;
  unsigned int nchannels;
  unsigned int nids;              // entries of channel_of_id
  unsigned int rank;
  unsigned int nranks;
  unsigned int vcs;
  unsigned int nreporters;
};

}  // namespace router
}  // namespace circuslink
