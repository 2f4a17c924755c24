// Validates a SentencePiece model (a serialized ModelProto, the bytes of
// tokenizer.model / spiece.model) before libsentencepiece loads it.
//
// libsentencepiece trusts its model file: a precompiled character map whose
// double-array trie points outside itself, or whose replacement offsets run
// past the string block, is read out of bounds by the normalizer on the first
// encode (a segmentation fault or a heap over-read), and a piece holding a NUL
// byte aborts the trie builder from inside the library. A model folder comes
// from the internet, so every structure libsentencepiece indexes with data
// from the file is checked here first, by reading the protobuf wire format
// directly (Debian ships no sentencepiece_model.pb.h).
#pragma once
#include <string>
#include <string_view>

namespace ft {

// Returns when libsentencepiece can load bytes without reading out of bounds;
// otherwise throws ft::Error "PATH: cannot load SentencePiece model: FIELD: WHAT".
// Checked: the wire format (lengths, varints, wire types, no repeated singular
// field), every piece (non-empty, valid UTF-8 without NUL, type in range,
// finite score), trainer_spec (model_type one of unigram/bpe/word/char,
// unk/bos/eos/pad ids inside the vocabulary), and each normalizer_spec's
// precompiled_charsmap: every trie unit the normalizer's prefix search can
// reach lies inside the trie, and every replacement offset it can return
// starts a UTF-8 character inside the string block with a NUL after it.
void check_sentencepiece_model(std::string_view bytes, const std::string& path);

}  // namespace ft
