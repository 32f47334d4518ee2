// The mpi transport's progress thread: one native thread per rank moves relay packets and connection puts
// over MPI, so that no packet waits for Python's interpreter loop (docs/scale.md, "The mpi transport").
//
// Built on first use by circuslink/transport/mpi.py (mpicxx, or a C++ compiler with MPI's flags), cached by
// source hash, loaded with ctypes beside mpi4py (both resolve the same libmpi). Python opens the rings and the
// inboxes, duplicates the communicator and hands its Fortran handle here; this thread then makes every MPI call
// of the transport, each under the process's MPI mutex (MPI runs at THREAD_SERIALIZED: Python's MPI calls take
// the same mutex through circuslink.world.MpiLock).
//
// Per peer, on the duplicated communicator:
//  * relay, out: packets the agent published in the out ring, batched by kind (never past the ring's end), go
//    as a META message (tag 1: count, first sequence number, both header words of each packet, low-latency
//    payloads) and, for bulk packets, one BULK message (tag 2) straight from the slots' bulk areas (a strided
//    datatype: no copy); slots go back to the agent when the sends complete; a packet is sent only while the
//    peer's in ring has room (sent - consumed < nslots);
//  * relay, in: a META receive is always posted; the BULK receive lands straight in the in ring's bulk areas of
//    the same slots; packets are published in order (low-latency units with their flags, bulk headers after the
//    payload), and the agent's consumed count goes back in CREDIT control messages (tag 3) every quarter ring and
//    whenever the agent has drained the ring. That count is the in ring's credit counter and, past it, every
//    packet whose slot credit the agent gave back (agent_consumed): grid agents store the counter only when a
//    call or grid session ends;
//  * puts: PUT (tag 4: offset, bytes, signal index + 1, value) and its data (tag 5) from a staged copy; the
//    receiver lands the data in its inbox and then sets the signal word (in order: a signal follows its data);
//  * closing: BYE (relay packets sent, puts sent) once this side's sends are complete, then FIN once BYE went and
//    the peer's came; done with the peer's FIN and everything the peer sent received.
// Every wait has the time-out; a failure is recorded once, as one line, and the agents' ends are told
// (ERR_ABORTED in both rings' error records) so nothing waits for a dead transport.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using u32 = uint32_t;
using u64 = uint64_t;
using Clock = std::chrono::steady_clock;

constexpr int kTagMeta = 1, kTagBulk = 2, kTagCtrl = 3, kTagPut = 4, kTagPutData = 5;
constexpr u64 kCtrlCredit = 1, kCtrlBye = 2, kCtrlFin = 3;
constexpr u32 kMetaHead = 4;      // words: count, kind (1 bulk), first seq lo, first seq hi
constexpr u32 kLlUnits = 32;      // 8-byte units of a slot's low-latency area
constexpr u32 kLlWords = kLlUnits - 2;  // payload words of a low-latency packet
constexpr u32 kLlPayload = 4 * kLlWords;
constexpr u32 kLlArea = 8 * kLlUnits;  // 256
constexpr u32 kKindBulk = 0x80000000u;
constexpr u32 kSizeMask = 0x00FFFFFFu;
constexpr u64 kRewritePeriod = 1ull << 31;
constexpr u32 kErrAborted = 4;    // channel protocol's ERR_ABORTED
constexpr u32 kErrClaimed = 0xFFFFFFFFu;  // ERR_CLAIMED: a record whose fields are being written
constexpr int kSpinPolls = 2000;

std::mutex g_mpi;  // every MPI call of the process: this thread's, and Python's through MpiLock

inline u32 flag_of(u64 seq) { return (u32)(seq & 0xFFFFFFFFull) | 1u; }
inline bool rewrites_all(u64 seq, u32 nslots) { return seq % kRewritePeriod < nslots; }
inline u32 ld32(const u32* p) { return *reinterpret_cast<const volatile u32*>(p); }
inline void st32(u32* p, u32 v) { *reinterpret_cast<volatile u32*>(p) = v; }
inline u64 ld64(const u64* p) { return *reinterpret_cast<const volatile u64*>(p); }
inline void st64(u64* p, u64 v) { *reinterpret_cast<volatile u64*>(p) = v; }
inline void acquire() { std::atomic_thread_fence(std::memory_order_acquire); }
inline void release() { std::atomic_thread_fence(std::memory_order_release); }

struct Failure {
  std::string what;
};

// One ring in host memory, laid out as circuslink.channels.protocol.layout: slots, the in-order credit counter
// and slot credits (the writer's), the error records of both ends.
struct Ring {
  unsigned char* slots = nullptr;
  u64* credit = nullptr;
  u32* slot_credits = nullptr;
  u32* send_error = nullptr;
  u32* recv_error = nullptr;
  u32 nslots = 0, slot_bytes = 0, chunk = 0;

  u32* head(u64 seq) const { return reinterpret_cast<u32*>(slots + (seq % nslots) * (u64)slot_bytes); }
  unsigned char* bulk(u64 seq) const { return slots + (seq % nslots) * (u64)slot_bytes + kLlArea; }
  // Whether packet seq is published: its header and, for a low-latency packet, every unit its size covers.
  bool published(u64 seq) const {
    const u32* w = head(seq);
    const u32 flag = flag_of(seq);
    if (ld32(w + 3) != flag) return false;
    const u32 word = ld32(w + 2);
    if (word & kKindBulk) {
      acquire();
      return true;
    }
    const u32 units = ((word & kSizeMask) + 3) / 4;
    for (u32 u = 0; u < units && u < kLlWords; ++u)
      if (ld32(w + 5 + 2 * u) != flag) return false;
    acquire();
    return true;
  }
};

struct Batch {
  u64 first, count;
  std::vector<MPI_Request> requests;
  std::vector<u32> meta;  // the META buffer, alive until its send completes
  Clock::time_point since;
};

struct Incoming {
  u64 first, count;
  bool bulk;
  std::vector<u32> headers;  // 2 per packet
  std::vector<u32> words;    // low-latency payload words
  MPI_Request request = MPI_REQUEST_NULL;
  Clock::time_point since;
};

struct PutOut {
  std::vector<unsigned char> data;
  u64 header[4];
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  bool posted = false;
  Clock::time_point since;
};

struct PutIn {
  u64 header[4];
  MPI_Request request = MPI_REQUEST_NULL;
  Clock::time_point since;
};

struct CtrlSend {
  u64 buf[3];
  MPI_Request request = MPI_REQUEST_NULL;
};

struct Progress;

struct Peer {
  Progress* e = nullptr;
  int peer = -1;
  // relay (optional)
  bool has_relay = false;
  Ring out, in;
  u32 max_batch = 1;
  u64 out_seq = 0, out_released = 0;  // next packet to send; packets whose slots went back
  u64 in_seq = 0;                     // next packet to publish
  u64 in_consumed = 0;                // packets of the in ring the agent has given back, in order
  u64 remote_consumed = 0, reported = 0, expected = 0;
  std::deque<Batch> inflight;
  std::deque<Incoming> incoming;
  std::vector<u32> meta_buf;
  MPI_Request meta_req = MPI_REQUEST_NULL;
  bool blocked = false;
  Clock::time_point blocked_since;
  // connection (optional)
  bool has_conn = false;
  unsigned char* inbox = nullptr;
  u64 inbox_bytes = 0;
  u64* signals = nullptr;
  u32 nsignals = 0;
  std::deque<std::unique_ptr<PutOut>> puts_out;  // staged by the host, sent in order
  std::deque<PutIn> puts_in;
  u64 put_header[4] = {0, 0, 0, 0};
  MPI_Request put_req = MPI_REQUEST_NULL;
  u64 puts_sent = 0, puts_received = 0;
  // control and closing
  u64 ctrl_buf[3] = {0, 0, 0};
  MPI_Request ctrl_req = MPI_REQUEST_NULL;
  std::vector<std::unique_ptr<CtrlSend>> ctrl_sends;
  bool bye_sent = false, fin_sent = false, peer_bye = false, peer_fin = false, done = false;
  u64 peer_packets = 0, peer_puts = 0;
  bool closing_started = false;
  Clock::time_point close_since;
};

struct Progress {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = -1;
  double timeout_s = 120.0;
  bool spin = false;
  std::vector<std::unique_ptr<Peer>> peers;
  std::map<std::pair<u32, u32>, MPI_Datatype> types;
  std::thread thread;
  std::atomic<bool> stop{false}, closing{false}, discard{false}, finished{false}, failed{false};
  std::mutex staged;  // puts staged by the host (Peer::puts_out, puts_issued)
  std::atomic<u64> puts_issued{0}, puts_completed{0};
  std::string error;
  // the test hook: the n-th MPI send (1-based) fails with this error class
  long fault_nth = 0, sends = 0;
  int fault_class = 0;
};

std::string mpi_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  int cls = rc;
  MPI_Error_class(rc, &cls);
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = std::snprintf(text, sizeof text, "error %d", rc);
  std::string s(text, (size_t)len);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  return s + " (error class " + std::to_string(cls) + ")";
}

std::string link_name(const Progress& e, int peer) {
  return "link rank " + std::to_string(e.rank) + " <-> rank " + std::to_string(peer) + " (transport mpi)";
}

[[noreturn]] void fail(const Peer& p, const std::string& what) { throw Failure{link_name(*p.e, p.peer) + ": " + what}; }

void check(const Peer& p, int rc, const std::string& what) {
  if (rc != MPI_SUCCESS) fail(p, "MPI error in " + what + ": " + mpi_text(rc));
}

int isend(Peer& p, const void* buf, int count, MPI_Datatype type, int tag, MPI_Request* req) {
  Progress& e = *p.e;
  if (e.fault_nth > 0 && ++e.sends == e.fault_nth) return e.fault_class;
  return MPI_Isend(buf, count, type, p.peer, tag, e.comm, req);
}

bool test(Peer& p, MPI_Request* req, const std::string& what) {
  if (*req == MPI_REQUEST_NULL) return true;
  int flag = 0;
  check(p, MPI_Test(req, &flag, MPI_STATUS_IGNORE), what);
  return flag != 0;
}

double seconds_since(Clock::time_point t, Clock::time_point now) {
  return std::chrono::duration<double>(now - t).count();
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

MPI_Datatype strided(Peer& p, u32 count, u32 block, u32 stride) {
  auto key = std::make_pair(count, block);
  auto it = p.e->types.find(key);
  if (it != p.e->types.end()) return it->second;
  MPI_Datatype t;
  check(p, MPI_Type_vector((int)count, (int)block, (int)stride, MPI_BYTE, &t), "making a datatype");
  check(p, MPI_Type_commit(&t), "committing a datatype");
  p.e->types[key] = t;
  return t;
}

void release_out(Peer& p, u64 upto) {
  for (u64 s = p.out_released; s < upto; ++s) st32(p.out.slot_credits + s % p.out.nslots, flag_of(s));
  if (upto > p.out_released) {
    release();
    p.out_released = upto;
    st64(p.out.credit, upto);
  }
}

void send_ctrl(Peer& p, u64 kind, u64 a, u64 b) {
  auto c = std::make_unique<CtrlSend>();
  c->buf[0] = kind;
  c->buf[1] = a;
  c->buf[2] = b;
  check(p, isend(p, c->buf, (int)sizeof c->buf, MPI_BYTE, kTagCtrl, &c->request), "sending control");
  p.ctrl_sends.push_back(std::move(c));
}

void post_receives(Peer& p) {
  if (p.has_relay) {
    check(p, MPI_Irecv(p.meta_buf.data(), (int)(p.meta_buf.size() * 4), MPI_BYTE, p.peer, kTagMeta, p.e->comm,
                       &p.meta_req), "posting the meta receive");
  }
  if (p.has_conn) {
    check(p, MPI_Irecv(p.put_header, (int)sizeof p.put_header, MPI_BYTE, p.peer, kTagPut, p.e->comm, &p.put_req),
          "posting the put receive");
  }
  check(p, MPI_Irecv(p.ctrl_buf, (int)sizeof p.ctrl_buf, MPI_BYTE, p.peer, kTagCtrl, p.e->comm, &p.ctrl_req),
        "posting the control receive");
}

// -- relay, out ---------------------------------------------------------------------------------------------
bool send_out(Peer& p, Clock::time_point now) {
  const Ring& r = p.out;
  const u64 seq = p.out_seq;
  if (!r.published(seq)) {
    p.blocked = false;
    return false;
  }
  if (seq - p.remote_consumed >= r.nslots) {
    if (!p.blocked) {
      p.blocked = true;
      p.blocked_since = now;
    } else if (seconds_since(p.blocked_since, now) > p.e->timeout_s) {
      fail(p, "rank " + std::to_string(p.peer) + "'s in ring stayed full for " + num(p.e->timeout_s) +
                  " s (its agent stopped taking packets; packet " + std::to_string(seq) + " waits to cross)");
    }
    return false;
  }
  p.blocked = false;
  const bool bulk = (ld32(r.head(seq) + 2) & kKindBulk) != 0;
  const u64 room = std::min<u64>({(u64)p.max_batch, r.nslots - (seq - p.remote_consumed), r.nslots - seq % r.nslots});
  u64 count = 1;
  while (count < room && r.published(seq + count) && ((ld32(r.head(seq + count) + 2) & kKindBulk) != 0) == bulk)
    ++count;
  Batch b;
  b.first = seq;
  b.count = count;
  b.since = now;
  b.meta.assign(kMetaHead + 2 * count + (bulk ? 0 : count * kLlWords), 0u);
  b.meta[0] = (u32)count;
  b.meta[1] = bulk ? 1u : 0u;
  b.meta[2] = (u32)(seq & 0xFFFFFFFFull);
  b.meta[3] = (u32)(seq >> 32);
  u64 at = kMetaHead + 2 * count;
  u32 longest = 0;
  for (u64 i = 0; i < count; ++i) {
    const u32* w = r.head(seq + i);
    const u32 route = ld32(w), word = ld32(w + 2);
    const u32 n = word & kSizeMask;
    if (n < 1 || n > (bulk ? r.chunk : kLlPayload))
      fail(p, "packet " + std::to_string(seq + i) + " in this rank's out ring has a corrupt header (size " +
                  std::to_string(n) + ")");
    b.meta[kMetaHead + 2 * i] = route;
    b.meta[kMetaHead + 2 * i + 1] = word;
    longest = std::max(longest, n);
    if (!bulk) {
      const u32 units = (n + 3) / 4;
      for (u32 u = 0; u < units; ++u) b.meta[at + u] = ld32(w + 4 + 2 * u);
      at += units;
    }
  }
  b.meta.resize(at);
  const std::string what = "sending packets " + std::to_string(seq) + ".." + std::to_string(seq + count - 1) +
                           " to rank " + std::to_string(p.peer);
  MPI_Request req;
  check(p, isend(p, b.meta.data(), (int)(b.meta.size() * 4), MPI_BYTE, kTagMeta, &req), what);
  b.requests.push_back(req);
  if (bulk) {
    const u32 block = (longest + 15) / 16 * 16;
    MPI_Datatype t = strided(p, (u32)count, block, r.slot_bytes);
    check(p, isend(p, r.bulk(seq), 1, t, kTagBulk, &req), what);
    b.requests.push_back(req);
  }
  p.inflight.push_back(std::move(b));
  p.out_seq = seq + count;
  return true;
}

bool complete_sends(Peer& p, Clock::time_point now) {
  bool moved = false;
  while (!p.inflight.empty()) {
    Batch& b = p.inflight.front();
    const std::string range = std::to_string(b.first) + ".." + std::to_string(b.first + b.count - 1);
    bool all = true;
    for (auto& req : b.requests) all = test(p, &req, "sending packets " + range + " to rank " +
                                                        std::to_string(p.peer)) && all;
    if (!all) {
      if (seconds_since(b.since, now) > p.e->timeout_s)
        fail(p, "MPI send of packets " + range + " to rank " + std::to_string(p.peer) + " did not complete within " +
                    num(p.e->timeout_s) + " s (rank " + std::to_string(p.peer) + "'s progress stopped receiving)");
      break;
    }
    release_out(p, b.first + b.count);  // the agent may reuse the slots
    p.inflight.pop_front();
    moved = true;
  }
  return moved;
}

// -- relay, in ----------------------------------------------------------------------------------------------
bool receive(Peer& p) {
  if (p.meta_req == MPI_REQUEST_NULL || !test(p, &p.meta_req, "receiving meta")) return false;
  const u32* m = p.meta_buf.data();
  const u64 count = m[0];
  const bool bulk = m[1] != 0;
  const u64 first = (u64)m[2] | ((u64)m[3] << 32);
  const Ring& r = p.in;
  if (count < 1 || count > p.max_batch || first != p.expected)
    fail(p, "rank " + std::to_string(p.peer) + " sent packets out of order or corrupt (count " + std::to_string(count) +
                ", first " + std::to_string(first) + ", expected " + std::to_string(p.expected) + ")");
  Incoming inc;
  inc.first = first;
  inc.count = count;
  inc.bulk = bulk;
  inc.since = Clock::now();
  inc.headers.assign(m + kMetaHead, m + kMetaHead + 2 * count);
  u32 largest = 0;
  u64 words = 0;
  for (u64 i = 0; i < count; ++i) {
    const u32 word = inc.headers[2 * i + 1];
    const u32 n = word & kSizeMask;
    if (n < 1 || n > (bulk ? r.chunk : kLlPayload) || ((word & kKindBulk) != 0) != bulk)
      fail(p, "rank " + std::to_string(p.peer) + " sent a corrupt header in packets " + std::to_string(first) + ".." +
                  std::to_string(first + count - 1));
    largest = std::max(largest, n);
    words += (n + 3) / 4;
  }
  if (first % r.nslots + count > r.nslots)
    fail(p, "rank " + std::to_string(p.peer) + " sent a batch across the ring's end (packets " +
                std::to_string(first) + "..)");
  if (bulk) {
    const u32 block = (largest + 15) / 16 * 16;
    MPI_Datatype t = strided(p, (u32)count, block, r.slot_bytes);
    check(p, MPI_Irecv(r.bulk(first), 1, t, p.peer, kTagBulk, p.e->comm, &inc.request),
          "receiving packets " + std::to_string(first) + ".." + std::to_string(first + count - 1) + " from rank " +
              std::to_string(p.peer));
  } else {
    inc.words.assign(m + kMetaHead + 2 * count, m + kMetaHead + 2 * count + words);
  }
  p.incoming.push_back(std::move(inc));
  p.expected = first + count;
  check(p, MPI_Irecv(p.meta_buf.data(), (int)(p.meta_buf.size() * 4), MPI_BYTE, p.peer, kTagMeta, p.e->comm,
                     &p.meta_req), "posting the meta receive");
  return true;
}

void publish_ll(Ring& r, u64 seq, u32 route, u32 word, const u32* words) {
  const u32 n = word & kSizeMask;
  const u32 flag = flag_of(seq);
  u32* w = r.head(seq);
  const u32 units = (n + 3) / 4;
  const u32 write = rewrites_all(seq, r.nslots) ? kLlWords : units;
  for (u32 u = 0; u < write; ++u) {
    st32(w + 4 + 2 * u, u < units ? words[u] : 0u);
    st32(w + 5 + 2 * u, flag);
  }
  st32(w, route);
  st32(w + 2, word);
  release();
  st32(w + 1, flag);
  st32(w + 3, flag);
}

void publish_bulk(Ring& r, u64 seq, u32 route, u32 word) {
  const u32 flag = flag_of(seq);
  u32* w = r.head(seq);
  if (rewrites_all(seq, r.nslots)) {
    for (u32 u = 0; u < kLlWords; ++u) {
      st32(w + 4 + 2 * u, 0u);
      st32(w + 5 + 2 * u, flag);
    }
  }
  release();  // the payload (written by MPI) before the header that publishes it
  st32(w, route);
  st32(w + 2, word);
  release();
  st32(w + 1, flag);
  st32(w + 3, flag);
}

bool publish(Peer& p, Clock::time_point now) {
  bool moved = false;
  while (!p.incoming.empty()) {
    Incoming& inc = p.incoming.front();
    const std::string range = std::to_string(inc.first) + ".." + std::to_string(inc.first + inc.count - 1);
    if (inc.request != MPI_REQUEST_NULL && !test(p, &inc.request, "receiving bulk data")) {
      if (seconds_since(inc.since, now) > p.e->timeout_s)
        fail(p, "MPI receive of packets " + range + " from rank " + std::to_string(p.peer) +
                    " did not complete within " + num(p.e->timeout_s) + " s");
      break;
    }
    u64 at = 0;
    for (u64 i = 0; i < inc.count; ++i) {
      const u32 route = inc.headers[2 * i], word = inc.headers[2 * i + 1];
      if (inc.bulk) {
        publish_bulk(p.in, inc.first + i, route, word);
      } else {
        publish_ll(p.in, inc.first + i, route, word, inc.words.data() + at);
        at += ((word & kSizeMask) + 3) / 4;
      }
    }
    p.in_seq = inc.first + inc.count;
    p.incoming.pop_front();
    moved = true;
  }
  return moved;
}

// The in ring's packets the agent has given back, in order: its credit counter and, past it, every packet whose
// slot credit is back (docs/protocol.md, Credits). Every reader stores each packet's slot credit at once; the grid
// forms store the counter only when a call or grid session ends, so the counter alone would stop the peer one ring
// into a grid session. An earlier lap's slot credit never matches (flag_of(s - k nslots) != flag_of(s)).
u64 agent_consumed(Peer& p) {
  u64 done = std::max(p.in_consumed, ld64(p.in.credit));
  while (done < p.in_seq && ld32(p.in.slot_credits + done % p.in.nslots) == flag_of(done)) ++done;
  acquire();  // the agent's loads of those slots came before its credits: the peer may overwrite them now
  p.in_consumed = done;
  return done;
}

bool report_credits(Peer& p) {
  if (p.peer_bye) return false;  // the peer has sent everything: it needs no more room
  const u64 consumed = agent_consumed(p);
  if (consumed <= p.reported) return false;
  const bool drained = consumed == p.in_seq;
  if (consumed - p.reported >= std::max<u64>(1, p.in.nslots / 4) || drained) {
    send_ctrl(p, kCtrlCredit, consumed, 0);
    p.reported = consumed;
    return true;
  }
  return false;
}

// -- puts -----------------------------------------------------------------------------------------------------
bool send_puts(Peer& p, Clock::time_point now) {
  bool moved = false;
  std::lock_guard<std::mutex> guard(p.e->staged);
  for (auto& put : p.puts_out) {
    if (put->posted) continue;
    put->since = now;
    const std::string what = "sending a put of " + std::to_string(put->header[1]) + " bytes to rank " +
                             std::to_string(p.peer);
    check(p, isend(p, put->header, (int)sizeof put->header, MPI_BYTE, kTagPut, &put->requests[0]), what);
    if (put->header[1] > 0)
      check(p, isend(p, put->data.data(), (int)put->header[1], MPI_BYTE, kTagPutData, &put->requests[1]), what);
    put->posted = true;
    moved = true;
  }
  while (!p.puts_out.empty() && p.puts_out.front()->posted) {
    PutOut& put = *p.puts_out.front();
    const bool a = test(p, &put.requests[0], "sending a put"), b = test(p, &put.requests[1], "sending a put");
    if (!(a && b)) {
      if (seconds_since(put.since, now) > p.e->timeout_s)
        fail(p, "a put of " + std::to_string(put.header[1]) + " bytes to rank " + std::to_string(p.peer) +
                    " did not complete within " + num(p.e->timeout_s) + " s");
      break;
    }
    p.puts_out.pop_front();
    ++p.puts_sent;
    p.e->puts_completed.fetch_add(1);
    moved = true;
  }
  return moved;
}

bool receive_puts(Peer& p, Clock::time_point now) {
  bool moved = false;
  while (p.put_req != MPI_REQUEST_NULL && test(p, &p.put_req, "receiving a put")) {
    PutIn in;
    std::memcpy(in.header, p.put_header, sizeof in.header);
    in.since = now;
    const u64 offset = in.header[0], nbytes = in.header[1], index = in.header[2];
    if (offset > p.inbox_bytes || nbytes > p.inbox_bytes - offset || index > p.nsignals)
      fail(p, "rank " + std::to_string(p.peer) + " put " + std::to_string(nbytes) + " bytes at offset " +
                  std::to_string(offset) + " (signal " + std::to_string(index) + ") beyond this inbox of " +
                  std::to_string(p.inbox_bytes) + " bytes and " + std::to_string(p.nsignals) + " signals");
    if (nbytes > 0)
      check(p, MPI_Irecv(p.inbox + offset, (int)nbytes, MPI_BYTE, p.peer, kTagPutData, p.e->comm, &in.request),
            "receiving a put");
    p.puts_in.push_back(in);
    moved = true;
    if (p.peer_bye && p.puts_received + p.puts_in.size() >= p.peer_puts) {
      p.put_req = MPI_REQUEST_NULL;  // the peer's last put: no receive stays posted
      break;
    }
    check(p, MPI_Irecv(p.put_header, (int)sizeof p.put_header, MPI_BYTE, p.peer, kTagPut, p.e->comm, &p.put_req),
          "posting the put receive");
  }
  while (!p.puts_in.empty()) {  // in order: a signal follows its own data and every earlier put's
    PutIn& in = p.puts_in.front();
    if (!test(p, &in.request, "receiving a put")) {
      if (seconds_since(in.since, now) > p.e->timeout_s)
        fail(p, "a put from rank " + std::to_string(p.peer) + " did not arrive within " + num(p.e->timeout_s) + " s");
      break;
    }
    if (in.header[2] > 0) {
      release();
      st64(p.signals + (in.header[2] - 1), in.header[3]);
    }
    p.puts_in.pop_front();
    ++p.puts_received;
    moved = true;
  }
  return moved;
}

// -- control and closing ---------------------------------------------------------------------------------------
bool control(Peer& p) {
  bool moved = false;
  while (p.ctrl_req != MPI_REQUEST_NULL && test(p, &p.ctrl_req, "receiving control")) {
    const u64 kind = p.ctrl_buf[0], a = p.ctrl_buf[1], b = p.ctrl_buf[2];
    if (kind == kCtrlCredit) {
      p.remote_consumed = std::max(p.remote_consumed, a);
    } else if (kind == kCtrlBye) {
      p.peer_bye = true;
      p.peer_packets = a;
      p.peer_puts = b;
      if (p.put_req != MPI_REQUEST_NULL && p.puts_received + p.puts_in.size() >= p.peer_puts) {
        MPI_Cancel(&p.put_req);  // every put of the peer's is in: the posted receive matches nothing
        MPI_Wait(&p.put_req, MPI_STATUS_IGNORE);
        p.put_req = MPI_REQUEST_NULL;
      }
    } else if (kind == kCtrlFin) {
      p.peer_fin = true;
    } else {
      fail(p, "rank " + std::to_string(p.peer) + " sent an unknown control message (" + std::to_string(kind) + ")");
    }
    moved = true;
    if (p.peer_fin) {
      p.ctrl_req = MPI_REQUEST_NULL;  // FIN is the peer's last control message
      break;
    }
    check(p, MPI_Irecv(p.ctrl_buf, (int)sizeof p.ctrl_buf, MPI_BYTE, p.peer, kTagCtrl, p.e->comm, &p.ctrl_req),
          "posting the control receive");
  }
  auto& sends = p.ctrl_sends;
  sends.erase(std::remove_if(sends.begin(), sends.end(),
                             [&](std::unique_ptr<CtrlSend>& c) { return test(p, &c->request, "sending control"); }),
              sends.end());
  return moved;
}

bool puts_pending(Peer& p) {
  std::lock_guard<std::mutex> guard(p.e->staged);
  return !p.puts_out.empty();
}

bool close_steps(Peer& p, Clock::time_point now) {
  if (!p.closing_started) {
    p.closing_started = true;
    p.close_since = now;
  }
  bool moved = false;
  const bool out_idle = !p.has_relay || (p.inflight.empty() && !p.out.published(p.out_seq));
  if (!p.bye_sent && out_idle && !puts_pending(p)) {
    send_ctrl(p, kCtrlBye, p.out_seq, p.puts_sent);
    p.bye_sent = moved = true;
  }
  if (p.bye_sent && p.peer_bye && !p.fin_sent) {
    send_ctrl(p, kCtrlFin, 0, 0);
    p.fin_sent = moved = true;
  }
  const bool all_in = p.peer_bye && (!p.has_relay || (p.in_seq == p.peer_packets && p.incoming.empty())) &&
                      p.puts_received == p.peer_puts && p.puts_in.empty();
  if (p.fin_sent && p.peer_fin && all_in && p.ctrl_sends.empty()) {
    if (p.meta_req != MPI_REQUEST_NULL) {
      MPI_Cancel(&p.meta_req);
      MPI_Wait(&p.meta_req, MPI_STATUS_IGNORE);
    }
    if (p.put_req != MPI_REQUEST_NULL) {
      MPI_Cancel(&p.put_req);
      MPI_Wait(&p.put_req, MPI_STATUS_IGNORE);
    }
    p.done = true;
    return true;
  }
  if (seconds_since(p.close_since, now) > p.e->timeout_s) {
    std::string why;
    if (!p.bye_sent) {
      why = p.has_relay && p.out.published(p.out_seq)
                ? "packet " + std::to_string(p.out_seq) + " could not cross: rank " + std::to_string(p.peer) +
                      "'s in ring stayed full"
                : "its last sends did not complete";
    } else if (!p.peer_bye || !p.peer_fin) {
      why = "rank " + std::to_string(p.peer) + " did not close its end";
    } else {
      why = "packets from rank " + std::to_string(p.peer) + " did not all arrive (" + std::to_string(p.in_seq) +
            " of " + std::to_string(p.peer_packets) + ")";
    }
    fail(p, "closing timed out after " + num(p.e->timeout_s) + " s: " + why);
  }
  return moved;
}

bool progress(Peer& p, Clock::time_point now, bool closing, bool discard) {
  bool moved = false;
  if (p.has_relay) {
    moved |= send_out(p, now);
    moved |= complete_sends(p, now);
    moved |= receive(p);
    moved |= publish(p, now);
    if (discard && agent_consumed(p) < p.in_seq) {
      st64(p.in.credit, p.in_seq);  // no agent reads any more: what arrives is taken and dropped
      moved = true;
    }
  }
  if (p.has_conn) {
    moved |= send_puts(p, now);
    moved |= receive_puts(p, now);
  }
  moved |= control(p);
  if (p.has_relay) moved |= report_credits(p);
  if (closing) moved |= close_steps(p, now);
  return moved;
}

void tell_agents(Peer& p) {
  if (!p.has_relay) return;
  const std::pair<u32*, u64> ends[2] = {{p.out.send_error, p.out_seq}, {p.in.recv_error, p.in_seq}};
  for (const auto& [err, seq] : ends) {
    // Claim the record as a device end does (detail/channel_impl.cuh, record_error): the first failure wins,
    // and the code, published last, tells a reader the fields are there.
    u32 none = 0;
    if (!__atomic_compare_exchange_n(err, &none, kErrClaimed, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) continue;
    st32(err + 1, 0);
    st32(err + 2, (u32)(seq & 0xFFFFFFFFull));
    st32(err + 3, (u32)(seq >> 32));
    release();
    st32(err, kErrAborted);
  }
}

void abandon(Peer& p) {
  for (MPI_Request* req : {&p.meta_req, &p.put_req, &p.ctrl_req}) {
    if (*req != MPI_REQUEST_NULL) {
      MPI_Cancel(req);
      MPI_Request_free(req);
      *req = MPI_REQUEST_NULL;
    }
  }
}

void run(Progress* e) {
  int idle = 0;
  double sleep_s = 20e-6;
  try {
    while (!e->stop.load()) {
      const auto now = Clock::now();
      bool moved = false, all_done = true;
      {
        std::lock_guard<std::mutex> guard(g_mpi);
        const bool closing = e->closing.load(), discard = e->discard.load();
        for (auto& p : e->peers) {
          if (p->done) continue;
          moved |= progress(*p, now, closing, discard);
          all_done = all_done && p->done;
        }
      }
      if (all_done && e->closing.load()) break;
      if (moved || e->spin) {
        idle = 0;
        sleep_s = 20e-6;
        if (!moved) std::this_thread::yield();
        continue;
      }
      if (++idle < kSpinPolls) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
        sleep_s = std::min(2 * sleep_s, 100e-6);  // an idle relay wakes within ~0.1 ms (spin: never sleeps)
      }
    }
  } catch (const Failure& f) {
    e->error = f.what;
  } catch (const std::exception& x) {
    e->error = "mpi transport progress of rank " + std::to_string(e->rank) + ": " + x.what();
  }
  if (!e->error.empty()) {
    e->failed.store(true);
    std::lock_guard<std::mutex> guard(g_mpi);
    for (auto& p : e->peers) {
      tell_agents(*p);
      abandon(*p);
    }
  }
  e->finished.store(true);
}

}  // namespace

extern "C" {

int clm_abi_version() { return 2; }
void clm_lock() { g_mpi.lock(); }
void clm_unlock() { g_mpi.unlock(); }

void* clm_progress_new(long long comm_f, int rank, double timeout_s, int spin) {
  auto* e = new Progress();
  e->comm = MPI_Comm_f2c((MPI_Fint)comm_f);
  e->rank = rank;
  e->timeout_s = timeout_s;
  e->spin = spin != 0;
  std::lock_guard<std::mutex> guard(g_mpi);
  MPI_Comm_set_errhandler(e->comm, MPI_ERRORS_RETURN);  // every call's error is named, never fatal
  return e;
}

static Peer& peer_of(Progress* e, int peer) {
  for (auto& p : e->peers)
    if (p->peer == peer) return *p;
  auto p = std::make_unique<Peer>();
  p->e = e;
  p->peer = peer;
  e->peers.push_back(std::move(p));
  return *e->peers.back();
}

// A relay to `peer`: the out ring (slots, credit counter, slot credits, the writer's error record) and the in ring
// (slots, credit counter, slot credits, the reader's error record) as pointers into host memory, of `nslots` slots
// of 256 + chunk bytes.
int clm_progress_add_relay(void* handle, int peer, void* out_slots, void* out_credit, void* out_slot_credits,
                         void* out_send_error, void* in_slots, void* in_credit, void* in_slot_credits,
                         void* in_recv_error, unsigned nslots, unsigned chunk, unsigned batch) {
  Progress* e = static_cast<Progress*>(handle);
  Peer& p = peer_of(e, peer);
  p.has_relay = true;
  for (Ring* r : {&p.out, &p.in}) {
    r->nslots = nslots;
    r->chunk = chunk;
    r->slot_bytes = kLlArea + chunk;
  }
  p.out.slots = static_cast<unsigned char*>(out_slots);
  p.out.credit = static_cast<u64*>(out_credit);
  p.out.slot_credits = static_cast<u32*>(out_slot_credits);
  p.out.send_error = static_cast<u32*>(out_send_error);
  p.in.slots = static_cast<unsigned char*>(in_slots);
  p.in.credit = static_cast<u64*>(in_credit);
  p.in.slot_credits = static_cast<u32*>(in_slot_credits);
  p.in.recv_error = static_cast<u32*>(in_recv_error);
  p.max_batch = batch;
  p.meta_buf.assign(kMetaHead + batch * (2 + kLlWords), 0u);
  return 0;
}

// A connection to `peer`: my inbox (the peer's puts land here) and my signal words.
int clm_progress_add_connection(void* handle, int peer, void* inbox, unsigned long long nbytes, void* signals,
                              unsigned nsignals) {
  Progress* e = static_cast<Progress*>(handle);
  Peer& p = peer_of(e, peer);
  p.has_conn = true;
  p.inbox = static_cast<unsigned char*>(inbox);
  p.inbox_bytes = nbytes;
  p.signals = static_cast<u64*>(signals);
  p.nsignals = nsignals;
  return 0;
}

// Post every receive and start the thread; 0, or -1 with the error recorded.
int clm_progress_start(void* handle) {
  Progress* e = static_cast<Progress*>(handle);
  try {
    std::lock_guard<std::mutex> guard(g_mpi);
    for (auto& p : e->peers) post_receives(*p);
  } catch (const Failure& f) {
    e->error = f.what;
    e->failed.store(true);
    e->finished.store(true);
    return -1;
  }
  e->thread = std::thread(run, e);
  return 0;
}

// Stage a put of `nbytes` from `src` into the peer's inbox at `offset`, then (index > 0) set its signal word
// index - 1 to `value`. The data is copied: the caller may reuse `src` on return. -1: no connection, or failed.
int clm_put(void* handle, int peer, unsigned long long offset, const void* src, unsigned long long nbytes,
            unsigned index, unsigned long long value) {
  Progress* e = static_cast<Progress*>(handle);
  if (e->failed.load()) return -1;
  for (auto& p : e->peers) {
    if (p->peer != peer || !p->has_conn) continue;
    auto put = std::make_unique<PutOut>();
    put->data.assign(static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + nbytes);
    put->header[0] = offset;
    put->header[1] = nbytes;
    put->header[2] = index;
    put->header[3] = value;
    std::lock_guard<std::mutex> guard(e->staged);
    p->puts_out.push_back(std::move(put));
    e->puts_issued.fetch_add(1);
    return 0;
  }
  return -1;
}

// Puts staged and not yet complete (flush waits for 0).
unsigned long long clm_puts_pending(void* handle) {
  Progress* e = static_cast<Progress*>(handle);
  return e->puts_issued.load() - e->puts_completed.load();
}

void clm_progress_close(void* handle) { static_cast<Progress*>(handle)->closing.store(true); }
void clm_progress_discard(void* handle) { static_cast<Progress*>(handle)->discard.store(true); }
int clm_progress_finished(void* handle) { return static_cast<Progress*>(handle)->finished.load() ? 1 : 0; }

// The recorded failure (one line) into `buf`; 1 when there is one.
int clm_progress_error(void* handle, char* buf, int len) {
  Progress* e = static_cast<Progress*>(handle);
  if (!e->failed.load() || len <= 0) return 0;
  std::snprintf(buf, (size_t)len, "%s", e->error.c_str());
  return 1;
}

// Record a failure from the host (a close that timed out) and stop.
void clm_progress_fail(void* handle, const char* what) {
  Progress* e = static_cast<Progress*>(handle);
  if (!e->failed.load()) {
    e->error = what;
    e->failed.store(true);
  }
  e->stop.store(true);
}

// Stop at once (the error path): join the thread (bounded by the caller's wait on clm_progress_finished), cancel.
void clm_progress_stop(void* handle) {
  Progress* e = static_cast<Progress*>(handle);
  e->stop.store(true);
}

// Join the finished thread, free the datatypes and the state. Only once clm_progress_finished says so (or the
// thread never started).
void clm_progress_free(void* handle) {
  Progress* e = static_cast<Progress*>(handle);
  if (e->thread.joinable()) e->thread.join();
  {
    std::lock_guard<std::mutex> guard(g_mpi);
    if (!e->finished.load() || e->failed.load())
      for (auto& p : e->peers) abandon(*p);
    for (auto& kv : e->types) MPI_Type_free(&kv.second);
  }
  delete e;
}

// The test hook: the n-th MPI send of this thread (1-based, every tag) fails with MPI error class `cls`.
void clm_progress_fault(void* handle, long nth, int cls) {
  Progress* e = static_cast<Progress*>(handle);
  e->fault_nth = nth;
  e->fault_class = cls;
}

}  // extern "C"
