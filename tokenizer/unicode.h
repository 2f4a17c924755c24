// The Unicode pieces the byte-level BPE tokenizer needs: UTF-8 conversion,
// the character classes of the GPT-2 pre-tokenizer pattern, and NFC.
// Tables come from scripts/make_unicode_tables.py (tokenizer/unicode_tables.inc).
#pragma once
#include <string>
#include <string_view>

namespace ft::unicode {

// Strict UTF-8 decoding: an invalid sequence is an Error naming `what` and the byte offset.
std::u32string decode_utf8(std::string_view text, std::string_view what);
std::string encode_utf8(std::u32string_view text);
void append_utf8(std::string& out, char32_t cp);

// Lossy decoding for model output: each maximal invalid subsequence becomes one U+FFFD,
// as Rust's String::from_utf8_lossy (what Hugging Face tokenizers' decoders use) does.
std::string utf8_lossy(std::string_view bytes);

bool is_letter(char32_t cp);      // general category L*  (\p{L})
bool is_number(char32_t cp);      // general category N*  (\p{N})
bool is_whitespace(char32_t cp);  // White_Space property (\s in Oniguruma, which HF tokenizers uses)

// Normalization form C with the normalization data of Unicode 9.0, as Hugging Face tokenizers'
// NFC has (characters assigned later have combining class 0 and no decomposition).
std::u32string nfc(std::u32string_view text);

}  // namespace ft::unicode
