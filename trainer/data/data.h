// Training data: JSONL rows -> token sequences with loss masks -> shuffled
// micro-batches of host i32 tensors. Framework-free: the model code consumes
// the Batch tensors. The pipeline:
//
//   Dataset data = load_jsonl(path, DataFormat::automatic);
//   TokenizedDataset tokens = tokenize_dataset(data, tokenizer, seq_len, eos_id, &chat_template);
//   DataLoader loader(make_rows(tokens, seq_len, Packing::padding_free), micro_batch_size, seq_len,
//                     padding_id(tokenizer), seed, host_allocator);
//   Batch batch = loader.next();                 // training, shuffled
//   Batch batch = loader.batch_in_order(i);      // evaluation, file order
#pragma once
#include <cstdint>
#include <functional>
#include <istream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.h"
#include "trainer/data/chat_template.h"
#include "trainer/enum_names.h"

namespace ft {

class Tokenizer;

enum class DataFormat { automatic, prompt_completion, text, chat, alpaca };
EnumNames<DataFormat> enum_names(DataFormat);  // data.format's spellings (trainer/enum_names.h)

// One JSONL row. Text rows ({"text": ...}) have an empty prompt and the text
// as completion, so "loss on the completion" covers every token of them.
// Alpaca rows ({"instruction", "input", "output"}) become Stanford Alpaca's
// prompt and the output as completion. Chat rows ({"messages": [...]}) keep
// their messages (prompt and completion empty): the chat template renders them.
// A chat row with tools (a row-level "tools" list of function schemas, an
// assistant message with "tool_calls", "tool" messages with the results) or
// with content as a list of text parts ({"type": "text", "text": ...})
// also keeps the row's messages and tools as written, in `conversation`
// (their key order too: a template writes them with tojson), and the
// template renders those, as apply_chat_template(messages, tools=tools);
// `messages` then holds each one's text (message_text).
struct Example {
  std::string prompt;
  std::string completion;
  std::vector<ChatMessage> messages = {};
  int64_t line = 0;  // in the file, for errors found after loading
  nlohmann::ordered_json conversation = nullptr;  // a row kept as written: {"messages", "tools"}; else null
};

struct Dataset {
  std::string path;
  DataFormat format = DataFormat::automatic;  // the rows' format once loaded
  std::vector<Example> examples;
};

// Stanford Alpaca's prompt (train.py's PROMPT_DICT): the variant with an
// "### Input:" block when input is not empty. The output follows it directly.
std::string alpaca_prompt(const std::string& instruction, const std::string& input);

// The longest JSONL line accepted, in bytes (16 MiB: millions of tokens,
// far beyond any seq_len). A longer line is refused before it is stored.
inline constexpr size_t kMaxJsonlLineBytes = size_t(16) << 20;

// path's extension in lowercase (".csv" of "rows.CSV"), "" for none.
std::string file_extension(const std::string& path);

// Reads one JSON object a line; blank lines are skipped. With format automatic
// the first row decides, and every row must agree with it. Extra fields in a
// row are ignored, the keys of another format too (row_format's order, trl's).
// A Parquet, Arrow or CSV file is refused by its extension, saying what reads
// it. Errors name the file and the line.
Dataset load_jsonl(const std::string& path, DataFormat format);
// Same, from a stream; path names it in messages.
Dataset load_jsonl(std::istream& input, const std::string& path, DataFormat format);

// The "prompt" string of every JSONL row (other fields are ignored, so an
// eval set serves); the same line and file errors as load_jsonl.
std::vector<std::string> load_prompts(const std::string& path);

// Calls on_row(row, "path:line") for every JSON object line of path (blank
// lines skipped), with load_jsonl's line errors; an unreadable file is an
// error naming file_kind ("data file"), a non-object row or an empty file one
// saying `expected`. string_field: row[key], which must be a string.
void read_jsonl_rows(const std::string& path, const char* file_kind, const std::string& expected,
                     const std::function<void(const nlohmann::json& row, const std::string& where)>& on_row);
// read_jsonl_rows, also giving each row's line as read.
void read_jsonl_lines(const std::string& path, const char* file_kind, const std::string& expected,
                      const std::function<void(const std::string& line, const nlohmann::json& row,
                                               const std::string& where)>& on_row);
std::string string_field(const nlohmann::json& row, const char* key, const std::string& where);
// "keys \"a\", \"b\"" (or "no keys"): what a row holds, for messages.
std::string key_list(const nlohmann::json& row);

// tokens[i] is a token id; loss_mask[i] = 1 when predicting tokens[i] from
// tokens[0..i) carries loss (completion tokens and eos; never bos or prompt).
// A padding-free packed row (make_rows) holds several examples one after
// another: example_starts gives where each begins in tokens (the first at
// 0), and each predicts only its own tokens from its own. Empty: one example.
struct TokenSequence {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;
  std::vector<int64_t> example_starts = {};
};

struct TokenizedDataset {
  std::vector<TokenSequence> examples;
  int64_t truncated_count = 0;  // examples cut to seq_len + 1 tokens (beginning kept)
  int64_t dropped_count = 0;    // examples left with no loss token after truncation
  int64_t loss_token_count = 0;
};

// How trl tokenizes a prompt/completion row (SFTTrainer, and DPOTrainer and
// RewardTrainer for each side of a pair): the prompt and the prompt +
// completion are each tokenized whole, text_tokens ([bos] + encode(text), as
// tokenizer(text) adds bos), and the completion starts where the two first
// differ (common_prefix_length): a space that ends the prompt merges into the
// completion's first token as it does in the joined text. eos_id follows
// unless -1 or the completion's tokens already end with it (trl appends the
// eos text only to a completion that does not end with it).
std::vector<int32_t> text_tokens(const Tokenizer& tokenizer, const std::string& text);
size_t common_prefix_length(const std::vector<int32_t>& a, const std::vector<int32_t>& b);
// `whole` with loss from token prompt_tokens on, then eos_id as above; cut to
// seq_len + 1 tokens (truncated says whether it was).
TokenSequence completion_sequence(std::vector<int32_t> whole, size_t prompt_tokens, int32_t eos_id, int64_t seq_len,
                                  bool& truncated);
// One example as tokenize_dataset makes it (below): completion_sequence of
// the joined text, cut to seq_len + 1 tokens; it may carry no loss token.
TokenSequence tokenize_example(const Example& example, const Tokenizer& tokenizer, int64_t seq_len, int32_t eos_id,
                               bool& truncated);
// A seq2seq (T5) row: encode(prompt) + [eos] for the encoder, then encode(completion) + [eos] as
// labels (transformers' tokenizer(prompt), tokenizer(text_target=completion)).
// The row fits seq_len + 1 tokens: labels keep at most seq_len / 2 tokens,
// the prompt's beginning fills the rest (each part keeps its eos). truncated
// says whether anything was cut. (Text rows get their prompt from
// split_text_row first.)
TokenSequence tokenize_seq2seq_example(const Example& example, const Tokenizer& tokenizer, int64_t seq_len,
                                       int32_t eos_id, bool& truncated);

// A text row as an encoder input and labels: cut after the last occurrence
// of marker (which stays with the input), or, without marker or where it
// does not occur, at the word boundary nearest the middle (a prefix-LM
// objective).
std::pair<std::string, std::string> split_text_row(const std::string& text, const std::string& marker);

// The tokens that carry loss (loss_mask[0] never does: nothing precedes it).
int64_t loss_token_count(const TokenSequence& sequence);

// tokenize_example's: [bos] + encode(prompt + completion) + [eos_id], loss
// from the completion on (bos where the tokenizer defines one, eos_id unless
// -1: trainer/data/special_tokens.h picks it), cut to seq_len + 1 tokens. Chat rows are tokenize_chat(render_chat(...)) with
// `chat`, which they require; the template places bos and end markers itself.
// Examples whose prompt fills the whole window teach nothing and are dropped
// (and counted); an error if that leaves none.
// With layout seq2seq each row is tokenize_seq2seq_example's (above)
// instead: the encoder's tokens, then the labels. With packing concatenate
// (below) no example is cut: the windows cut the joined stream.
// With scope's flags off (trl's SFTConfig completion_only_loss and
// assistant_only_loss false) a decoder-only row trains on every token after
// its first: a prompt/completion row (alpaca and conversational
// prompt/completion rows too) with completion_only off, a chat row of
// messages with assistant_only off.
enum class RowLayout { causal, seq2seq };
enum class Packing;
struct LossScope {
  bool completion_only = true;
  bool assistant_only = true;
};
TokenizedDataset tokenize_dataset(const Dataset& data, const Tokenizer& tokenizer, int64_t seq_len, int32_t eos_id,
                                  const ChatTemplate* chat = nullptr, RowLayout layout = RowLayout::causal,
                                  Packing packing = Packing{}, LossScope scope = {});  // Packing::none

// What a chat model is given to reply to `messages`: them rendered with
// add_generation_prompt (and the tools, null for none), exactly as
// apply_chat_template writes it (its bos text too, where the template writes
// one): PromptForm::chat tokenizes it. `where` names it in errors.
std::string reply_prompt(const ChatTemplate& chat, const nlohmann::ordered_json& messages,
                         const nlohmann::ordered_json& tools, const std::string& where);
// reply_prompt of `conversation`, which must end with a user message.
std::string generation_prompt(const ChatTemplate& chat, const std::vector<ChatMessage>& conversation,
                              const std::string& where, const nlohmann::ordered_json& tools = nullptr);

// Refuses tools that are not a JSON list of objects (apply_chat_template's
// tools), naming `what` (a row's "tools", or a --tools file).
void check_tool_schemas(const nlohmann::ordered_json& tools, const std::string& what);
// A row's "tools", checked: null when it has none (or null), the list, or
// the list a JSON string holds (as trl's json.loads reads datasets that
// store mixed schemas as strings).
nlohmann::ordered_json row_tools(const nlohmann::ordered_json& row, const std::string& where);
// Whether a chat row is kept as written (Example::conversation), beyond
// {"role", "content"} strings: a "tools" list, tool calls, tool results, or
// a message's content as a list of text parts.
bool kept_as_written(const nlohmann::json& row);
// Such a row's {"messages", "tools"} (tools null when it has none), `row`
// parsed from its line with the key order kept (templates write schemas with
// tojson), checked: its last message the assistant's (a training row) or,
// to_reply, a user's or a tool's result (a prompt). Errors name `where` and
// the message.
nlohmann::ordered_json written_conversation(const nlohmann::ordered_json& row, const std::string& where,
                                            bool to_reply);
// The conversation of `prompt`'s messages then `reply`'s, as a chat example
// keeps trl's conversational prompt/completion row (and each side of a
// conversational pair): {"messages", "prompt_messages" (the prompt's count),
// "tools" where not null}.
nlohmann::ordered_json prompt_and_reply(const nlohmann::ordered_json& prompt, const nlohmann::ordered_json& reply,
                                        const nlohmann::ordered_json& tools);

// Whether a JSONL data file holds chat rows: format chat, or automatic with
// a first row that has "messages" (read alone, so a run can check its chat
// template before it loads a model). A file that cannot be read or parsed
// says no: loading it names the problem.
bool holds_chat_rows(const std::string& path, DataFormat format);

// A row's "messages" list of {"role", "content"} strings (roles not checked
// here: check_chat_roles for training, generation_prompt for a reply).
std::vector<ChatMessage> chat_messages(const nlohmann::json& row, const std::string& where);

// A chat row's messages up to its reply: a conversational prompt/completion
// row's prompt messages, else all but the last.
nlohmann::ordered_json messages_before_reply(const nlohmann::ordered_json& conversation);
// trl's conversational prompt/completion row (Example::conversation with
// "prompt_messages"): the prompt rendered with add_generation_prompt and the
// whole conversation, each tokenized as apply_chat_template does, the
// completion from where they first differ to the end (end markers and the
// text after them included, no eos added: the template writes its own), as
// trl's SFTTrainer; cut to seq_len + 1 tokens.
TokenSequence tokenize_chat_completion(const ChatTemplate& chat, const nlohmann::ordered_json& conversation,
                                       const Tokenizer& tokenizer, int64_t seq_len, const std::string& where,
                                       bool& truncated);

// For samples and task_metric: each chat example's prompt becomes the
// reply_prompt of its conversation before its last assistant turn (with its
// tools; any roles), "" when nothing comes before it, and its completion
// that turn's content.
void set_chat_prompts(Dataset& data, const ChatTemplate& chat);

// The rendered text encoded in one piece, as apply_chat_template tokenizes it
// (special-token strings become their ids), a token carrying loss when it
// holds a byte of a loss piece (return_assistant_tokens_mask's rule). Piece
// boundaries are found by encoding the text up to each one: the tokens it
// shares with the whole text lie before the boundary, and one more straddles
// it when the encodings part there.
TokenSequence tokenize_chat(const std::vector<RenderedPiece>& pieces, const Tokenizer& tokenizer);

// The id written into padding positions: pad, else eos, else 0. Padding never
// carries loss, so the choice only matters for what the model attends to.
int32_t padding_id(const Tokenizer& tokenizer);

// data.packing: how examples become the loader's rows of seq_len inputs.
//   none: every example is its own row, padded to seq_len.
//   padding_free (what `true` means, as trl's padding_free and transformers'
//     DataCollatorWithFlattening): whole examples share rows, placed by
//     best-fit decreasing on their lengths (deterministic). An example of n
//     tokens fills n - 1 inputs (its last token is only a target); each one's
//     positions restart at 0 and attention never crosses into another, so its
//     loss and gradients are those it has alone in a row. The loss stays the
//     mean over the micro-batch's counted tokens, as unpacked.
//   concatenate: the examples are joined in order and cut into windows of
//     seq_len + 1 tokens that start seq_len apart (consecutive windows share
//     one token, so every token of the stream is predicted once), attention
//     crossing from one example into the next: pretraining's packing.
enum class Packing { none, padding_free, concatenate };
EnumNames<Packing> enum_names(Packing);  // data.packing's spellings besides true and false

// The rows the loader batches, each at most seq_len inputs (see Packing).
std::vector<TokenSequence> make_rows(const TokenizedDataset& data, int64_t seq_len, Packing packing);

// Padding-free packing's parts. The inputs an example fills in a packed row:
// all its tokens but the last, which is only predicted.
int64_t input_slots(const TokenSequence& example);
// Indices of items grouped into bins of `capacity` by best-fit decreasing
// (deterministic: the sizes alone decide); every size must be in [1, capacity].
std::vector<std::vector<size_t>> best_fit_decreasing(const std::vector<int64_t>& sizes, int64_t capacity);
// The examples of each group joined, in group order, into one packed row.
std::vector<TokenSequence> join_examples(const std::vector<TokenSequence>& examples,
                                         const std::vector<std::vector<size_t>>& groups);

struct Batch {
  Tensor input_ids;  // i32 [micro_batch_size, seq_len]
  Tensor targets;    // i32 [micro_batch_size, seq_len]: next token, or -100 = no loss
  // Targets != -100. Can be 0 (an epoch's padded tail, or with concatenate
  // packing a window inside a long prompt): normalise the loss by the sum over
  // the accumulated micro-batches, not per micro-batch.
  int64_t counted_tokens;
  // Padding-free packed rows: i32 [micro_batch_size, seq_len], each token's
  // position within its example (a row's padding tail counts as one more);
  // undefined otherwise.
  Tensor position_ids = {};
  // Pairs (PreferenceLoader) whose data has trl's "margin" column: pair i's
  // margin; empty otherwise.
  std::vector<double> margins = {};
  // position_ids for LanguageModel::forward: null where undefined.
  const Tensor* positions() const { return position_ids.defined() ? &position_ids : nullptr; }
};

constexpr int32_t kIgnoreIndex = -100;

// Position of the next micro-batch: the loader's whole state besides its data.
struct DataPosition {
  int64_t epoch = 0;
  int64_t index = 0;  // micro-batch within the epoch, [0, batches_per_epoch)
};

// Rows [0, count) in an epoch's order: a Fisher-Yates shuffle driven by
// std::mt19937_64(seed + epoch), identical on every platform.
std::vector<int64_t> shuffled_order(int64_t count, uint64_t seed, int64_t epoch);

class DataLoader {
 public:
  // host_allocator must be a CPU allocator that outlives the batches.
  DataLoader(std::vector<TokenSequence> rows, int64_t micro_batch_size, int64_t seq_len, int32_t pad_id, uint64_t seed,
             Allocator& host_allocator);

  // Rows per epoch / micro_batch_size, rounded up: the last micro-batch of an
  // epoch is padded with empty rows (all targets -100).
  int64_t batches_per_epoch() const;
  int64_t row_count() const { return int64_t(rows_.size()); }

  // The micro-batch at position(), then advances; after the last micro-batch
  // of an epoch it moves to index 0 of the next one, which has a new order.
  Batch next();
  DataPosition position() const { return position_; }
  // Restores a position read from position() (e.g. from a checkpoint).
  void set_position(DataPosition position);

  // Rows in file order, no shuffling: for evaluation.
  Batch batch_in_order(int64_t index) const;

  // The row order of an epoch: shuffled_order(row_count(), seed, epoch).
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // The rows (indices into the loader's rows, in its epoch order) of the
  // micro-batch next() returns; fewer than micro_batch_size in an epoch's last.
  std::vector<int64_t> next_rows() const;

 private:
  Batch make_batch(const std::vector<int64_t>& order, int64_t index) const;
  void write_packed_row(Batch& batch, int64_t b, const TokenSequence& row) const;

  std::vector<TokenSequence> rows_;
  int64_t micro_batch_size_;
  int64_t seq_len_;
  int32_t pad_id_;
  uint64_t seed_;
  Allocator& allocator_;
  DataPosition position_;
  std::vector<int64_t> order_;  // epoch_order(position_.epoch)
  std::vector<int64_t> identity_order_;
  bool packed_ = false;  // padding-free rows: batches carry position_ids
};

}  // namespace ft
