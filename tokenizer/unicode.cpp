#include "tokenizer/unicode.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/error.h"

namespace ft::unicode {
namespace {

struct CodeRange {
  char32_t first, last;
};
struct CombiningRange {
  char32_t first, last;
  uint8_t combining_class;
};
struct Decomposition {
  char32_t code_point;
  uint16_t offset;  // into kDecompositionPool
  uint8_t length;
};
struct Composition {
  char32_t first, second, composed;
};

#include "tokenizer/unicode_tables.inc"

constexpr char32_t kReplacement = 0xFFFD;

// Hangul syllables compose and decompose by arithmetic (Unicode 3.12), not by table.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// One UTF-8 sequence starting at bytes[i]. Returns the number of bytes it spans; `cp` is set
// when the sequence is valid, otherwise the count is the maximal invalid prefix (at least 1),
// the unit from_utf8_lossy replaces by one U+FFFD.
size_t next_sequence(std::string_view bytes, size_t i, char32_t& cp, bool& valid) {
  const auto byte = [&](size_t k) { return uint8_t(bytes[k]); };
  uint8_t lead = byte(i);
  valid = false;
  if (lead < 0x80) {
    cp = lead;
    valid = true;
    return 1;
  }
  size_t length;
  uint8_t low = 0x80, high = 0xBF;  // allowed range of the second byte: excludes overlongs and surrogates
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 1;
  }
  char32_t value = lead & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) {
    if (i + k >= bytes.size()) return k;
    uint8_t b = byte(i + k);
    bool ok = k == 1 ? (b >= low && b <= high) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return k;
    value = (value << 6) | (b & 0x3F);
  }
  cp = value;
  valid = true;
  return length;
}

uint8_t combining_class(char32_t cp) {
  auto it = std::upper_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), cp,
                             [](char32_t value, const CombiningRange& r) { return value < r.first; });
  if (it == std::begin(kCombiningClasses) || cp > std::prev(it)->last) return 0;
  return std::prev(it)->combining_class;
}

// Appends the mapping of cp in `table` (sorted by code point), or cp itself when it has none.
template <size_t N>
void append_mapping(const Decomposition (&table)[N], std::u32string& out, char32_t cp) {
  auto it = std::lower_bound(std::begin(table), std::end(table), cp,
                             [](const Decomposition& d, char32_t value) { return d.code_point < value; });
  if (it == std::end(table) || it->code_point != cp) {
    out += cp;
    return;
  }
  out.append(kDecompositionPool + it->offset, it->length);
}

template <size_t N>
void append_decomposition(const Decomposition (&table)[N], std::u32string& out, char32_t cp) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    char32_t index = cp - kSBase;
    out += kLBase + index / kNCount;
    out += kVBase + (index % kNCount) / kTCount;
    if (index % kTCount) out += kTBase + index % kTCount;
    return;
  }
  append_mapping(table, out, cp);
}

// The primary composite of (first, second), or 0 when there is none.
char32_t compose_pair(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase && second < kVBase + kVCount)
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 && second > kTBase &&
      second < kTBase + kTCount)
    return first + (second - kTBase);
  auto key = std::pair(first, second);
  auto it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions), key,
                             [](const Composition& c, const auto& k) { return std::pair(c.first, c.second) < k; });
  if (it == std::end(kCompositions) || it->first != first || it->second != second) return 0;
  return it->composed;
}

// Full canonical (or compatibility) decomposition in canonical order: NFD (NFKD).
std::u32string decomposition(std::u32string_view text, bool compatibility) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t cp : text) {
    if (compatibility)
      append_decomposition(kCompatibilityDecompositions, out, cp);
    else
      append_decomposition(kDecompositions, out, cp);
  }
  // Canonical ordering: each run of non-starters sorted by combining class, stably.
  for (size_t i = 0; i < out.size();) {
    if (combining_class(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < out.size() && combining_class(out[end]) != 0) ++end;
    std::stable_sort(out.begin() + i, out.begin() + end,
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = end;
  }
  return out;
}

// Canonical composition (UAX #15): each character joins the last starter unless a character
// between them has a combining class of 0 or one at least its own.
std::u32string canonical_composition(const std::u32string& text) {
  std::u32string out;
  out.reserve(text.size());
  size_t starter = 0;
  int last_class = 256;  // blocks composition until the first starter
  for (char32_t cp : text) {
    int cls = combining_class(cp);
    if (!out.empty() && (last_class < cls || last_class == 0)) {
      if (char32_t composed = compose_pair(out[starter], cp)) {
        out[starter] = composed;
        continue;
      }
    }
    if (cls == 0) {
      starter = out.size();
      last_class = 0;
    } else {
      last_class = cls;
    }
    out += cp;
  }
  return out;
}

}  // namespace

std::u32string decode_utf8(std::string_view text, std::string_view what) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    bool valid;
    size_t length = next_sequence(text, i, cp, valid);
    FT_CHECK(valid, what, ": invalid UTF-8 at byte ", i);
    out += cp;
    i += length;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : text) append_utf8(out, cp);
  return out;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    char32_t cp = 0;
    bool valid;
    size_t length = next_sequence(bytes, i, cp, valid);
    if (valid)
      out.append(bytes.substr(i, length));
    else
      append_utf8(out, kReplacement);
    i += length;
  }
  return out;
}

bool is_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::u32string nfc(std::u32string_view text) {
  // Below U+0300 every character is its own NFC form, has combining class 0 and is never the
  // second half of a composition, so such text (ASCII, Latin-1) is already normalized.
  if (std::all_of(text.begin(), text.end(), [](char32_t cp) { return cp < 0x300; })) return std::u32string(text);
  return canonical_composition(decomposition(text, false));
}

std::string punctuation_class() {
  std::string out = "[!-/:-@\\[-`{-~";  // Rust's is_ascii_punctuation
  char range[32];
  for (const CodeRange& r : kPunctuationRanges) {
    std::snprintf(range, sizeof range, "\\x{%X}-\\x{%X}", unsigned(r.first), unsigned(r.last));
    out += range;
  }
  return out + "]";
}

std::u32string nfd(std::u32string_view text) { return decomposition(text, false); }
std::u32string nfkd(std::u32string_view text) { return decomposition(text, true); }
std::u32string nfkc(std::u32string_view text) { return canonical_composition(decomposition(text, true)); }

std::u32string lowercase(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t cp : text) append_mapping(kLowercase, out, cp);
  return out;
}

const std::array<char32_t, 256>& byte_level_chars() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[size_t(b)] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

int byte_level_byte(char32_t c) {
  static const std::vector<int> table = [] {
    std::vector<int> t(324, -1);  // the largest character of byte_level_chars is U+0143
    for (int b = 0; b < 256; ++b) t[byte_level_chars()[size_t(b)]] = b;
    return t;
  }();
  return c < table.size() ? table[c] : -1;
}

}  // namespace ft::unicode
