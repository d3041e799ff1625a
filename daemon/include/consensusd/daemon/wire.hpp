#pragma once
// The wire format (docs/design.md §6, docs/protocol.md): every message is a fixed
// 64-byte little-endian header frame plus a payload frame. An estimate
// larger than one chunk travels as several ESTIMATE messages, each with its
// offset and its own checksum. decode() checks everything that can be
// checked without the round state; the engine then drops stale and
// duplicate estimates. A reject is a value, never an exception: malformed
// traffic is counted, never averaged.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "consensusd/consensus/codec.hpp"
#include "consensusd/data/names.hpp"

namespace consensusd::wire {

inline constexpr std::uint32_t kMagic = 0x4453434e;  // "NCSD" on the wire
inline constexpr std::uint16_t kVersion = 3;
inline constexpr std::size_t kHeaderSize = 64;

// READY and RESYNC go the other way, receiver to sender: "my buffer for
// your estimates is free, send the next" (estimates of more than one chunk
// only); "a compressed frame of yours did not fit my copy: send it whole".
enum class Kind : std::uint8_t {
  Hello = 1,
  Estimate = 2,
  Decision = 3,
  Bye = 4,
  Ready = 5,
  Resync = 6
};
// HELLO's flags: an estimate in chunks to you is under way; the sender has
// no trainer (model.kind: external) and computes nothing until one attaches.
inline constexpr std::uint64_t kHelloSending = 1;
inline constexpr std::uint64_t kHelloIdle = 2;
// The sender runs a newer graph than the one this HELLO is in (it speaks
// that one because we seemed not to have applied the newer yet).
inline constexpr std::uint64_t kHelloNewer = 4;
// BYE's flag, sent back on a connection: the sender removed us from its
// graph (we still run one where it is our neighbour).
inline constexpr std::uint64_t kByeRemoved = 1;
// The most bytes one message carries; a larger estimate is sent in chunks.
inline constexpr std::size_t kChunkBytes = std::size_t{1} << 20;
// The parameters' type; Bf16, Fp16 and Int8 mark compressed frames
// (consensus/codec.hpp), and every message of a node that sends them.
enum class Dtype : std::uint8_t { Float32 = 1, Float64 = 2, Bf16 = 3, Fp16 = 4, Int8 = 5 };

std::size_t bytesPer(Dtype dtype);               // Float32, Float64
Dtype frameDtype(consensus::Compression codec);  // not for None

struct Header {
  Kind kind = Kind::Estimate;
  Dtype dtype = Dtype::Float32;
  std::uint32_t sender = 0;    // topology index
  std::uint32_t checksum = 0;  // CRC-32C of this message's payload
  std::int64_t round = 0;
  std::uint64_t dimension = 0;
  std::uint64_t topologyHash = 0;
  // Estimate, a compressed frame: the round of the sender's public copy it
  // builds on (docs/protocol.md, "Compressed estimates"); -1 otherwise.
  std::int64_t base = -1;
  std::uint64_t payloadBytes = 0;  // in this message
  // One field on the wire (offset 56), read by kind:
  std::uint64_t offset = 0;  // Estimate: where this chunk's bytes start in the estimate
  std::uint64_t flags = 0;   // Decision: 1 = used; Ready: the grant's id; Hello: kHello*
};

std::array<std::byte, kHeaderSize> encode(const Header& header);
// CRC-32C (Castagnoli): by carry-less multiplication folding where the CPU
// has VPCLMULQDQ and AVX2, else three streams of SSE4.2's crc32, else a table.
// `previous`: the checksum of what came before, to continue it
// (checksum(A B) == checksum(B, checksum(A))).
std::uint32_t checksum(const void* data, std::size_t bytes, std::uint32_t previous = 0);
// The ways this CPU can compute it, slowest first; every checksum and
// validate() in the process takes the one chosen (by default the last).
// Tests and benchmarks compare them.
enum class CrcPath { Portable, Sse42, Folding };
std::vector<CrcPath> crcPaths();
void useCrcPath(CrcPath path);
// The table-driven CRC-32C update (no final inversion), for other CPUs and tests.
std::uint32_t crc32cPortable(std::uint32_t crc, const unsigned char* at, std::size_t bytes);
// No Inf or NaN among the float32 (or float64) values: the separate pass for
// CPUs without SSE4.2 (validate() checks finiteness inside the CRC's pass).
bool exponentsAllClear(std::span<const std::byte> payload, bool isDouble);

// Why a message was dropped. Names appear in logs, status and metrics.
enum class Reject {
  Frames,  // not exactly header + payload
  Size,    // header frame not 64 bytes
  Magic,
  Version,
  Kind,
  Sender,  // header sender disagrees with the connection's identity
  NotNeighbor,
  Topology,  // another topology hash
  Dtype,
  Dimension,
  Length,  // payload size or offset disagrees with dimension x dtype
  Checksum,
  NonFinite,
  Handshake,  // the connection failed the ZMTP handshake (junk bytes, another mechanism)
  Auth,       // CURVE: the ZAP handler denied the key (not a neighbour's)
  // Chunked estimates (docs/protocol.md, "Estimates in chunks"):
  ChunkOrder,  // a chunk that does not continue the estimate being received
  Truncated,   // an estimate abandoned half received (the sender moved on or went quiet)
  Overrun,     // a new estimate while the last one's buffer is still in use
  // Compressed frames (docs/protocol.md, "Compressed estimates"):
  Gap,    // it does not build on the copy we hold (one was lost): a keyframe is asked for
  Frame,  // it does not decode onto the copy (a scale or value not finite, an overflow)
  Round,  // negative, or one the sender cannot honestly have reached (docs/protocol.md)
};
// Their names, in the enum's order: counters are indexed by them.
inline constexpr data::NameTable<Reject, 21> kRejectNames{{
    {Reject::Frames, "frames"},
    {Reject::Size, "header_size"},
    {Reject::Magic, "magic"},
    {Reject::Version, "version"},
    {Reject::Kind, "kind"},
    {Reject::Sender, "sender"},
    {Reject::NotNeighbor, "not_neighbor"},
    {Reject::Topology, "topology"},
    {Reject::Dtype, "dtype"},
    {Reject::Dimension, "dimension"},
    {Reject::Length, "length"},
    {Reject::Checksum, "checksum"},
    {Reject::NonFinite, "non_finite"},
    {Reject::Handshake, "handshake"},
    {Reject::Auth, "auth"},
    {Reject::ChunkOrder, "chunk_order"},
    {Reject::Truncated, "truncated"},
    {Reject::Overrun, "overrun"},
    {Reject::Gap, "gap"},
    {Reject::Frame, "frame"},
    {Reject::Round, "implausible_round"},
}};
inline constexpr std::size_t kRejectReasons = kRejectNames.size();
static_assert(static_cast<std::size_t>(Reject::Round) + 1 == kRejectReasons);
const char* toString(Reject reason);

struct Expectation {
  std::uint64_t topologyHash;
  std::uint64_t dimension;
  Dtype dtype;
  // Frames of this codec besides whole estimates of `dtype` (keyframes);
  // every other message then carries the frames' dtype.
  consensus::Compression compression = consensus::Compression::None;
  // The dtype a node's messages other than whole estimates carry.
  Dtype linkDtype() const {
    return compression == consensus::Compression::None ? dtype : frameDtype(compression);
  }
  // The bytes of a whole estimate (`dtype`) or of a whole frame.
  std::uint64_t totalBytes(Dtype of) const;
};

// Header frame -> Header, or why not (magic, version, kind, size).
std::variant<Header, Reject> decodeHeader(std::span<const std::byte> frame);

// Full check of a message against what this node expects; for an Estimate
// chunk also its length and offset (inside the estimate, whole values),
// checksum and finiteness (of a frame, the codec checks its values).
std::optional<Reject> validate(const Header& header, std::span<const std::byte> payload,
                               const Expectation& expect);

}  // namespace consensusd::wire
