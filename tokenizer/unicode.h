// The Unicode pieces the tokenizer.json pipeline needs: UTF-8 conversion, normalization forms,
// lowercasing and GPT-2's byte-level alphabet.
// Tables come from scripts/make_unicode_tables.py (tokenizer/unicode_tables.inc).
#pragma once
#include <array>
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

bool is_whitespace(char32_t cp);  // White_Space property (Rust's char::is_whitespace)

// Normalization form C with the normalization data of Unicode 9.0, as Hugging Face tokenizers'
// NFC has (characters assigned later have combining class 0 and no decomposition).
// NFD, NFKD and NFKC likewise (compatibility mappings of Unicode 9.0).
std::u32string nfc(std::u32string_view text);
std::u32string nfd(std::u32string_view text);
std::u32string nfkd(std::u32string_view text);
std::u32string nfkc(std::u32string_view text);

// Each character replaced by its full lowercase mapping (Rust's char::to_lowercase: "İ" becomes
// "i̇"; no final-sigma rule, as tokenizers' Lowercase).
std::u32string lowercase(std::u32string_view text);

// A PCRE2 character class of the characters tokenizers' Punctuation pre-tokenizer splits at:
// ASCII punctuation and general category P* as of Unicode 9.0 (the unicode_categories crate).
std::string punctuation_class();

// GPT-2's reversible byte -> character map: printable Latin-1 bytes stand for themselves, the
// others (control characters, space, 0x7F-0xA0, 0xAD) for U+0100 onwards, in byte order.
// Byte-level BPE runs on these characters, so a token never holds a raw space or control byte.
const std::array<char32_t, 256>& byte_level_chars();
// The byte a character of byte_level_chars stands for; -1 for any other character.
int byte_level_byte(char32_t c);

}  // namespace ft::unicode
