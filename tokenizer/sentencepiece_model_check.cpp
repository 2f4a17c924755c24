#include "tokenizer/sentencepiece_model_check.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/error.h"
#include "tokenizer/unicode.h"

namespace ft {
namespace {

// The protobuf wire types a ModelProto uses. Groups (3, 4) appear in no
// SentencePiece model and are refused with the invalid types 6 and 7.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t varint = 0;     // kVarint
  uint32_t fixed32 = 0;    // kFixed32
  std::string_view bytes;  // kBytes
};

template <class... Parts>
[[noreturn]] void refuse(const std::string& path, const std::string& field, const Parts&... parts) {
  fail(path, ": cannot load SentencePiece model: ", field, ": ", parts...);
}

// The fields of one message, in file order. `message` names it in errors
// ("pieces[3]", "trainer_spec").
class WireReader {
 public:
  WireReader(std::string_view data, const std::string& path, std::string message)
      : data_(data), path_(path), message_(std::move(message)) {}

  // Reads the next field into field; false at the end of the message.
  bool next(Field& field) {
    if (at_ == data_.size()) return false;
    const uint64_t tag = varint();
    if (tag > UINT32_MAX || (tag >> 3) == 0) refuse(path_, message_, "invalid field tag ", tag);
    field.number = uint32_t(tag >> 3);
    field.wire_type = uint32_t(tag & 7);
    switch (field.wire_type) {
      case kVarint: field.varint = varint(); break;
      case kFixed64: take(8); break;
      case kFixed32: std::memcpy(&field.fixed32, take(4).data(), 4); break;  // little-endian, as the host
      case kBytes: field.bytes = take(varint()); break;
      default: refuse(path_, message_, "field ", field.number, " has wire type ", field.wire_type,
                      ", which no SentencePiece model uses");
    }
    return true;
  }

  // Refuses field unless it has wire_type and is its first occurrence:
  // protobuf lets a repeated singular field overwrite (or merge into) the
  // first, so a duplicate could load something other than what was checked.
  void singular(const Field& field, uint32_t wire_type, const std::string& name) {
    expect(field, wire_type, name);
    for (uint32_t number : seen_)
      if (number == field.number) refuse(path_, message_ + "." + name, "appears twice");
    seen_.push_back(field.number);
  }

  void expect(const Field& field, uint32_t wire_type, const std::string& name) const {
    if (field.wire_type != wire_type)
      refuse(path_, message_ + "." + name, "wire type ", field.wire_type, ", expected ", wire_type);
  }

 private:
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (at_ == data_.size()) refuse(path_, message_, "truncated inside a varint at byte ", at_);
      const uint8_t byte = uint8_t(data_[at_++]);
      value |= uint64_t(byte & 0x7F) << shift;
      if (byte < 0x80) return value;
    }
    refuse(path_, message_, "varint longer than 10 bytes at byte ", at_);
  }

  std::string_view take(uint64_t size) {
    if (size > data_.size() - at_)
      refuse(path_, message_, "truncated: a field of ", size, " bytes at byte ", at_, " but ", data_.size() - at_,
             " bytes remain");
    std::string_view bytes = data_.substr(at_, size);
    at_ += size;
    return bytes;
  }

  std::string_view data_;
  size_t at_ = 0;
  const std::string& path_;
  std::string message_;
  std::vector<uint32_t> seen_;
};

// ModelProto.SentencePiece: piece = 1, score = 2, type = 3 (NORMAL 1,
// UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6).
void check_piece(std::string_view bytes, const std::string& path, size_t index) {
  const std::string name = "pieces[" + std::to_string(index) + "]";
  WireReader reader(bytes, path, name);
  std::string_view piece;
  Field field;
  while (reader.next(field)) {
    if (field.number == 1) {
      reader.singular(field, kBytes, "piece");
      piece = field.bytes;
    } else if (field.number == 2) {
      reader.singular(field, kFixed32, "score");
      float score;
      std::memcpy(&score, &field.fixed32, 4);
      if (!std::isfinite(score)) refuse(path, name + ".score", "not finite (", score, ")");
    } else if (field.number == 3) {
      reader.singular(field, kVarint, "type");
      const int32_t type = int32_t(field.varint);  // protobuf keeps an enum's low 32 bits
      if (type < 1 || type > 6) refuse(path, name + ".type", type, " is not a piece type (1 to 6)");
    }
  }
  if (piece.empty()) refuse(path, name + ".piece", "empty");
  // libsentencepiece builds its tries from the pieces as C strings: a NUL
  // byte makes a key empty or out of order, and the builder aborts.
  if (piece.find('\0') != std::string_view::npos) refuse(path, name + ".piece", "contains a NUL byte");
  unicode::decode_utf8(piece, path + ": cannot load SentencePiece model: " + name + ".piece");
}

// The trainer_spec fields libsentencepiece relies on when it loads, with
// their proto defaults.
struct TrainerSpec {
  int32_t model_type = 1;  // UNIGRAM 1, BPE 2, WORD 3, CHAR 4
  int32_t unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
};

TrainerSpec read_trainer_spec(std::string_view bytes, const std::string& path) {
  TrainerSpec spec;
  WireReader reader(bytes, path, "trainer_spec");
  const struct {
    uint32_t number;
    const char* name;
    int32_t TrainerSpec::*value;
  } fields[] = {{3, "model_type", &TrainerSpec::model_type}, {40, "unk_id", &TrainerSpec::unk_id},
                {41, "bos_id", &TrainerSpec::bos_id},         {42, "eos_id", &TrainerSpec::eos_id},
                {43, "pad_id", &TrainerSpec::pad_id}};
  Field field;
  while (reader.next(field))
    for (const auto& known : fields)
      if (field.number == known.number) {
        reader.singular(field, kVarint, known.name);
        spec.*known.value = int32_t(field.varint);  // int32 fields keep the low 32 bits, as protobuf does
      }
  if (spec.model_type < 1 || spec.model_type > 4)
    refuse(path, "trainer_spec.model_type", spec.model_type, " is not unigram (1), bpe (2), word (3) or char (4)");
  return spec;
}

void check_special_id(const std::string& path, const char* name, int32_t id, int32_t lowest, size_t pieces) {
  if (id < lowest || id >= int64_t(pieces))
    refuse(path, std::string("trainer_spec.") + name, id, " is outside the vocabulary of ", pieces, " pieces",
           lowest < 0 ? " (-1 means none)" : "");
}

// darts-clone's DoubleArrayUnit (sentencepiece's third_party/darts_clone/darts.h):
// a unit is a node (label in the low byte, has_leaf bit 8, offset to its
// children's base in the bits above, scaled by 256 when bit 9 is set) or a
// value (bit 31 set, so its label never equals a byte).
uint32_t unit_label(uint32_t unit) { return unit & ((1u << 31) | 0xFF); }
bool unit_has_leaf(uint32_t unit) { return (unit >> 8) & 1; }
uint32_t unit_value(uint32_t unit) { return unit & ((1u << 31) - 1); }
uint32_t unit_offset(uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); }

// Walks every node Darts::DoubleArray::commonPrefixSearch can reach from the
// root, as it walks them: at a node whose children's base is b, the next byte
// c of the text selects unit b ^ c, a child when its label is c; a child with
// has_leaf holds its value at unit (child's base) ^ 0. Any byte can come next,
// so all 256 units of a reached base must exist.
void check_charsmap_trie(std::string_view trie, std::string_view strings, const std::string& path,
                         const std::string& name) {
  const size_t units = trie.size() / 4;
  auto unit_at = [&](size_t index) {
    uint32_t unit;
    std::memcpy(&unit, trie.data() + 4 * index, 4);
    return unit;
  };
  if (units == 0) refuse(path, name, "the trie is empty");
  const size_t last_nul = strings.rfind('\0');
  std::vector<bool> visited(units);
  std::vector<size_t> bases = {unit_offset(unit_at(0))};
  while (!bases.empty()) {
    const size_t base = bases.back();
    bases.pop_back();
    if ((base | 0xFF) >= units)
      refuse(path, name, "a trie node's children reach unit ", base | 0xFF, " but the trie has ", units, " units");
    if (visited[base]) continue;
    visited[base] = true;
    for (uint32_t byte = 0; byte < 256; byte++) {
      const size_t node = base ^ byte;
      const uint32_t unit = unit_at(node);
      if (unit_label(unit) != byte) continue;
      const size_t child_base = node ^ unit_offset(unit);
      if (unit_has_leaf(unit)) {
        if (child_base >= units)
          refuse(path, name, "trie unit ", node, " keeps its value at unit ", child_base, " but the trie has ", units,
                 " units");
        const uint32_t offset = unit_value(unit_at(child_base));
        if (offset >= strings.size())
          refuse(path, name, "trie unit ", child_base, " points at byte ", offset, ", past the ", strings.size(),
                 "-byte string block");
        if (last_nul == std::string_view::npos || offset > last_nul)
          refuse(path, name, "trie unit ", child_base, " points at byte ", offset,
                 " of the string block, with no NUL after it");
        if ((uint8_t(strings[offset]) & 0xC0) == 0x80)
          refuse(path, name, "trie unit ", child_base, " points inside a UTF-8 character at byte ", offset,
                 " of the string block");
      }
      bases.push_back(child_base);
    }
  }
}

void check_precompiled_charsmap(std::string_view blob, const std::string& path, const std::string& name) {
  if (blob.empty()) return;  // no map: the normalizer leaves characters as they are
  uint32_t trie_bytes;
  if (blob.size() < 4) refuse(path, name, blob.size(), " bytes, shorter than its 4-byte trie size");
  std::memcpy(&trie_bytes, blob.data(), 4);  // little-endian, as the host
  if (trie_bytes > blob.size() - 4)
    refuse(path, name, "a trie of ", trie_bytes, " bytes but only ", blob.size() - 4, " bytes follow its size");
  if (trie_bytes % 4 != 0) refuse(path, name, "a trie of ", trie_bytes, " bytes is not a whole number of 4-byte units");
  const std::string_view strings = blob.substr(4 + trie_bytes);
  unicode::decode_utf8(strings, path + ": cannot load SentencePiece model: " + name + "'s string block");
  check_charsmap_trie(blob.substr(4, trie_bytes), strings, path, name);
}

// NormalizerSpec: precompiled_charsmap = 2; the other fields are flags and
// names libsentencepiece reads without indexing anything.
void check_normalizer_spec(std::string_view bytes, const std::string& path, const std::string& name) {
  WireReader reader(bytes, path, name);
  Field field;
  while (reader.next(field))
    if (field.number == 2) {
      reader.singular(field, kBytes, "precompiled_charsmap");
      check_precompiled_charsmap(field.bytes, path, name + ".precompiled_charsmap");
    }
}

}  // namespace

// ModelProto: pieces = 1 (repeated), trainer_spec = 2, normalizer_spec = 3,
// self_test_data = 4, denormalizer_spec = 5; unknown fields are skipped, as
// protobuf skips them.
void check_sentencepiece_model(std::string_view bytes, const std::string& path) {
  WireReader reader(bytes, path, "ModelProto");
  size_t pieces = 0;
  TrainerSpec trainer;
  bool has_trainer_spec = false, has_normalizer_spec = false;
  Field field;
  while (reader.next(field)) {
    if (field.number == 1) {
      reader.expect(field, kBytes, "pieces");
      check_piece(field.bytes, path, pieces++);
    } else if (field.number == 2) {
      reader.singular(field, kBytes, "trainer_spec");
      trainer = read_trainer_spec(field.bytes, path);
      has_trainer_spec = true;
    } else if (field.number == 3 || field.number == 5) {
      const char* name = field.number == 3 ? "normalizer_spec" : "denormalizer_spec";
      reader.singular(field, kBytes, name);
      check_normalizer_spec(field.bytes, path, name);
      has_normalizer_spec |= field.number == 3;
    }
  }
  // The trainer writes the pieces first and both specs after them, so a file
  // cut between two fields (still valid protobuf) lacks the specs.
  if (pieces == 0) refuse(path, "pieces", "none (an empty or truncated file?)");
  if (!has_trainer_spec) refuse(path, "trainer_spec", "missing (a truncated file?)");
  if (!has_normalizer_spec) refuse(path, "normalizer_spec", "missing (a truncated file?)");
  check_special_id(path, "unk_id", trainer.unk_id, 0, pieces);
  check_special_id(path, "bos_id", trainer.bos_id, -1, pieces);
  check_special_id(path, "eos_id", trainer.eos_id, -1, pieces);
  check_special_id(path, "pad_id", trainer.pad_id, -1, pieces);
}

}  // namespace ft
