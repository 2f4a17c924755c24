// Safetensors reading, writing and sharded checkpoints. Bad files are written
// byte by byte here, so every validation in the reader is exercised.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kernels/error.h"
#include "model/safetensors.h"

using namespace ft;

namespace {

// A fresh folder under the build tree, removed with everything in it.
struct TempDir {
  std::string path;
  TempDir() {
    std::string pattern = std::string(FT_BINARY_DIR) + "/safetensors_test_XXXXXX";
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = char(value >> (8 * i));
  return bytes;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A safetensors file by hand: header length, header text, data block.
std::string write_raw(const TempDir& dir, const std::string& header, const std::string& data) {
  std::string path = dir.file("raw.safetensors");
  write_file(path, le64(header.size()) + header + data);
  return path;
}

// The message of the Error that action throws ("" when it throws none).
template <class Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

bool has(const std::string& message, const std::string& part) { return message.find(part) != std::string::npos; }

// Opening path as a safetensors file fails naming the file and saying why.
void check_rejected(const std::string& path, const std::string& phrase) {
  std::string message = error_of([&] { SafetensorsFile file(path); });
  CAPTURE(message);
  CHECK(has(message, path));
  CHECK(has(message, phrase));
}

// A host tensor whose bytes are a recognisable pattern.
Tensor patterned(const Shape& shape, DType dtype, HostAllocator& host, int seed) {
  Tensor tensor = Tensor::empty(shape, dtype, host, MemCategory::weights);
  auto* bytes = static_cast<uint8_t*>(tensor.data);
  for (size_t i = 0; i < tensor.size_bytes(); ++i) bytes[i] = uint8_t(i * 37 + seed);
  return tensor;
}

bool same_bytes(const Tensor& a, const void* data, size_t bytes) {
  return a.size_bytes() == bytes && (bytes == 0 || std::memcmp(a.data, data, bytes) == 0);
}

const std::string kF32Pair = R"("dtype":"F32","shape":[2])";  // 8 bytes

}  // namespace

TEST_CASE("round trip keeps bytes, shapes and dtypes of every dtype") {
  TempDir dir;
  HostAllocator host;
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"w.f32", patterned({3, 5}, DType::f32, host, 1)},  {"w.bf16", patterned({2, 3, 4}, DType::bf16, host, 2)},
      {"w.f16", patterned({7}, DType::f16, host, 3)},     {"w.i8", patterned({5, 3}, DType::i8, host, 4)},
      {"w.i32", patterned({1, 9}, DType::i32, host, 5)},  {"scalar", patterned({}, DType::f32, host, 6)},
      {"empty", patterned({0, 4}, DType::bf16, host, 7)}, {"last", patterned({2}, DType::f16, host, 8)}};
  std::string path = dir.file("model.safetensors");
  save_safetensors(path, tensors, {{"format", "pt"}});
  save_safetensors(path, tensors, {{"format", "pt"}});  // replacing an existing file works too
  CHECK(!std::filesystem::exists(path + ".tmp"));

  SafetensorsFile file(path);
  CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "pt"}});
  REQUIRE(file.entries().size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {  // sorted by offset = the order written
    const SafetensorsEntry& entry = file.entries()[i];
    const Tensor& expected = tensors[i].second;
    CAPTURE(entry.name);
    CHECK(entry.name == tensors[i].first);
    CHECK(entry.dtype == expected.dtype);
    CHECK(entry.shape == expected.shape);
    CHECK(entry.file == path);
    CHECK(same_bytes(expected, entry.data, entry.size_bytes));
  }

  // The data block starts 8-byte aligned, as Python's writer lays it out.
  std::ifstream raw(path, std::ios::binary);
  uint8_t length[8];
  raw.read(reinterpret_cast<char*>(length), 8);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length[i];
  CHECK((8 + header_bytes) % 8 == 0);

  Checkpoint checkpoint(path);
  Tensor view = checkpoint.view("w.bf16");
  CHECK(view.shape == Shape{2, 3, 4});
  CHECK(view.dtype == DType::bf16);
  CHECK(view.storage == nullptr);
  CHECK(same_bytes(tensors[1].second, view.data, view.size_bytes()));
  CHECK(checkpoint.names().size() == tensors.size());
}

TEST_CASE("a folder holding model.safetensors is a checkpoint") {
  TempDir dir;
  HostAllocator host;
  Tensor weight = patterned({4, 4}, DType::f32, host, 9);
  save_safetensors(dir.file("model.safetensors"), {{"weight", weight}});
  Checkpoint checkpoint(dir.path);
  CHECK(checkpoint.contains("weight"));
  CHECK(!checkpoint.contains("bias"));
  CHECK(checkpoint.total_bytes() == 64);
  CHECK(same_bytes(weight, checkpoint.view("weight").data, 64));
}

TEST_CASE("a folder of PyTorch pickle weights only is refused naming the file and how to convert it") {
  TempDir dir;
  write_file(dir.file("pytorch_model.bin"), "PK");
  CHECK_THROWS_WITH_AS(Checkpoint(dir.path),
                       (dir.path + ": folder holds pytorch_model.bin (PyTorch pickle weights) but no model.safetensors; "
                                   "only safetensors files are read (load it with transformers and "
                                   "save_pretrained(folder, safe_serialization=True))").c_str(),
                       Error);
}

TEST_CASE("sharded checkpoint through model.safetensors.index.json") {
  TempDir dir;
  HostAllocator host;
  Tensor a = patterned({8, 2}, DType::bf16, host, 10), b = patterned({3}, DType::f32, host, 11);
  Tensor c = patterned({5, 5}, DType::i8, host, 12);
  save_safetensors(dir.file("model-00001-of-00002.safetensors"), {{"a", a}, {"b", b}});
  save_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"c", c}});
  write_file(dir.file("model.safetensors.index.json"),
             R"({"metadata": {"total_size": 69}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                 "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  Checkpoint checkpoint(dir.path);
  CHECK(checkpoint.names() == std::vector<std::string>{"a", "b", "c"});
  CHECK(checkpoint.total_bytes() == 32 + 12 + 25);
  CHECK(has(checkpoint.entry("c").file, "model-00002-of-00002.safetensors"));
  CHECK(has(checkpoint.entry("a").file, "model-00001-of-00002.safetensors"));
  CHECK(same_bytes(a, checkpoint.view("a").data, a.size_bytes()));
  CHECK(same_bytes(b, checkpoint.view("b").data, b.size_bytes()));
  CHECK(same_bytes(c, checkpoint.view("c").data, c.size_bytes()));
}

TEST_CASE("file shorter than the header length field") {
  TempDir dir;
  write_file(dir.file("short.safetensors"), "abc");
  check_rejected(dir.file("short.safetensors"), "shorter than the 8-byte header length");
  write_file(dir.file("zero.safetensors"), "");
  check_rejected(dir.file("zero.safetensors"), "shorter than the 8-byte header length");
}

TEST_CASE("header length exceeding the file") {
  TempDir dir;
  std::string path = dir.file("long.safetensors");
  write_file(path, le64(1000) + "{}");
  check_rejected(path, "header length 1000 exceeds the file (10 bytes)");
}

TEST_CASE("malformed JSON header") {
  TempDir dir;
  check_rejected(write_raw(dir, R"({"w": {"dtype": "F32", )", ""), "header: not valid JSON");
}

TEST_CASE("header that is not a JSON object") {
  TempDir dir;
  check_rejected(write_raw(dir, "[1, 2]", ""), "header must be a JSON object");
}

TEST_CASE("overlapping data offsets") {
  TempDir dir;
  std::string header = R"({"w1": {)" + kF32Pair + R"(,"data_offsets":[0,8]}, "w2": {)" + kF32Pair +
                       R"(,"data_offsets":[4,12]}})";
  std::string path = write_raw(dir, header, std::string(12, 'x'));
  check_rejected(path, "overlapping data_offsets");
  check_rejected(path, R"(tensors "w1" and "w2")");
}

TEST_CASE("data offsets past the end of the data block") {
  TempDir dir;
  std::string path = write_raw(dir, R"({"w": {)" + kF32Pair + R"(,"data_offsets":[0,8]}})", std::string(4, 'x'));
  check_rejected(path, R"(tensor "w": data_offsets [0,8] run past the end of the data block (4 bytes))");
}

TEST_CASE("data offsets with begin after end") {
  TempDir dir;
  std::string path = write_raw(dir, R"({"w": {)" + kF32Pair + R"(,"data_offsets":[8,0]}})", std::string(8, 'x'));
  check_rejected(path, "begin > end");
}

TEST_CASE("dtype and shape disagreeing with the byte count") {
  TempDir dir;
  std::string path =
      write_raw(dir, R"({"w": {"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'x'));
  check_rejected(path, R"(tensor "w": data_offsets hold 8 bytes but dtype F32 with shape [3] needs 12 bytes)");
}

TEST_CASE("unsupported dtype") {
  TempDir dir;
  for (std::string dtype : {"F64", "I64", "BOOL", "complex"}) {
    std::string path =
        write_raw(dir, R"({"w": {"dtype":")" + dtype + R"(","shape":[1],"data_offsets":[0,8]}})", std::string(8, 'x'));
    check_rejected(path, R"(tensor "w": unsupported dtype ")" + dtype + "\"");
  }
}

TEST_CASE("older transformers' saved buffers are ignored whatever their dtype, as transformers 5 ignores them") {
  TempDir dir;
  // GPT-NeoX's causal mask as BOOL (or U8), masked_bias as F16 -inf, a rotary inv_freq as F64, beside one weight.
  const std::string header =
      R"({"gpt_neox.layers.0.attention.bias": {"dtype":"BOOL","shape":[1,1,2,2],"data_offsets":[0,4]},)"
      R"("gpt_neox.layers.0.attention.masked_bias": {"dtype":"F16","shape":[],"data_offsets":[4,6]},)"
      R"("model.layers.0.self_attn.rotary_emb.inv_freq": {"dtype":"F64","shape":[1],"data_offsets":[6,14]},)"
      R"("gpt_neox.layers.0.attention.dense.bias": {)" + kF32Pair + R"(,"data_offsets":[14,22]}})";
  const SafetensorsFile file(write_raw(dir, header, std::string(22, '\0')));
  REQUIRE(file.entries().size() == 1);
  CHECK(file.entries()[0].name == "gpt_neox.layers.0.attention.dense.bias");
}

TEST_CASE("entries missing a field or holding the wrong type") {
  TempDir dir;
  std::string data(8, 'x');
  check_rejected(write_raw(dir, R"({"w": {"shape":[2],"data_offsets":[0,8]}})", data), R"(tensor "w": missing "dtype")");
  check_rejected(write_raw(dir, R"({"w": {"dtype":"F32","data_offsets":[0,8]}})", data), R"(tensor "w": missing "shape")");
  check_rejected(write_raw(dir, R"({"w": {)" + kF32Pair + "}}", data), R"(tensor "w": missing "data_offsets")");
  check_rejected(write_raw(dir, R"({"w": {"dtype":5,"shape":[2],"data_offsets":[0,8]}})", data), R"("dtype" must be a string)");
  check_rejected(write_raw(dir, R"({"w": {"dtype":"F32","shape":"2","data_offsets":[0,8]}})", data),
                 R"("shape" must be an array of integers)");
  check_rejected(write_raw(dir, R"({"w": {"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", data),
                 "must hold only integers");
  check_rejected(write_raw(dir, R"({"w": {)" + kF32Pair + R"(,"data_offsets":[0]}})", data), R"("data_offsets" must be [begin, end])");
  check_rejected(write_raw(dir, R"({"w": {)" + kF32Pair + R"(,"data_offsets":[-8,0]}})", data), "non-negative");
  check_rejected(write_raw(dir, R"({"w": [1, 2]})", data), R"(tensor "w": expected an object)");
}

TEST_CASE("negative shape extent") {
  TempDir dir;
  std::string path =
      write_raw(dir, R"({"w": {"dtype":"F32","shape":[-1,-2],"data_offsets":[0,8]}})", std::string(8, 'x'));
  check_rejected(path, R"(tensor "w": negative shape extent)");
}

TEST_CASE("__metadata__ must map strings to strings") {
  TempDir dir;
  check_rejected(write_raw(dir, R"({"__metadata__": {"format": 1}})", ""), R"(key "format" must hold a string)");
  check_rejected(write_raw(dir, R"({"__metadata__": "pt"})", ""), "must be an object of strings");
}

TEST_CASE("missing tensor names the tensor and the checkpoint") {
  TempDir dir;
  HostAllocator host;
  std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"present", patterned({2}, DType::f32, host, 1)}});
  Checkpoint checkpoint(path);
  CHECK(error_of([&] { checkpoint.entry("absent"); }) == path + ": missing tensor \"absent\"");
  CHECK(has(error_of([&] { checkpoint.view("absent"); }), "missing tensor \"absent\""));
}

TEST_CASE("index naming a missing shard") {
  TempDir dir;
  HostAllocator host;
  save_safetensors(dir.file("shard1.safetensors"), {{"a", patterned({2}, DType::f32, host, 1)}});
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"a": "shard1.safetensors", "b": "shard2.safetensors"}})");
  std::string message = error_of([&] { Checkpoint checkpoint(dir.path); });
  CAPTURE(message);
  CHECK(has(message, dir.file("model.safetensors.index.json")));
  CHECK(has(message, R"(tensor "b" in shard "shard2.safetensors")"));
  CHECK(has(message, dir.file("shard2.safetensors") + " does not exist"));
}

TEST_CASE("index naming a tensor its shard does not hold") {
  TempDir dir;
  HostAllocator host;
  save_safetensors(dir.file("shard1.safetensors"), {{"a", patterned({2}, DType::f32, host, 1)}});
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"a": "shard1.safetensors", "ghost": "shard1.safetensors"}})");
  std::string message = error_of([&] { Checkpoint checkpoint(dir.path); });
  CAPTURE(message);
  CHECK(has(message, R"(tensor "ghost")"));
  CHECK(has(message, dir.file("shard1.safetensors") + " but that shard does not hold it"));
}

TEST_CASE("a tensor in two shards is refused") {
  TempDir dir;
  HostAllocator host;
  save_safetensors(dir.file("shard1.safetensors"), {{"a", patterned({2}, DType::f32, host, 1)}});
  save_safetensors(dir.file("shard2.safetensors"), {{"a", patterned({2}, DType::f32, host, 2)}});
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"a": "shard1.safetensors", "b": "shard2.safetensors"}})");
  std::string message = error_of([&] { Checkpoint checkpoint(dir.path); });
  CAPTURE(message);
  CHECK(has(message, R"(tensor "a" appears in both)"));
}

TEST_CASE("malformed index and empty folders are refused") {
  TempDir dir;
  CHECK(has(error_of([&] { Checkpoint checkpoint(dir.path); }), "neither model.safetensors nor"));
  CHECK(has(error_of([&] { Checkpoint checkpoint(dir.file("nothing")); }), "checkpoint not found"));
  write_file(dir.file("model.safetensors.index.json"), R"({"metadata": {}})");
  CHECK(has(error_of([&] { Checkpoint checkpoint(dir.path); }), R"(missing "weight_map")"));
  write_file(dir.file("model.safetensors.index.json"), R"({"weight_map": )");
  CHECK(has(error_of([&] { Checkpoint checkpoint(dir.path); }), "not valid JSON"));
}

TEST_CASE("the writer refuses tensors it cannot write") {
  TempDir dir;
  HostAllocator host;
  MetaAllocator meta;
  Tensor good = patterned({2}, DType::f32, host, 1);
  Tensor no_data = Tensor::empty({2}, DType::f32, meta, MemCategory::weights);
  std::string path = dir.file("out.safetensors");
  CHECK(has(error_of([&] { save_safetensors(path, {{"a", good}, {"a", good}}); }), R"(tensor "a" given twice)"));
  CHECK(has(error_of([&] { save_safetensors(path, {{"m", no_data}}); }), "must be a host tensor"));
  CHECK(has(error_of([&] { save_safetensors(path, {{"__metadata__", good}}); }), "invalid tensor name"));
  CHECK(!std::filesystem::exists(path));
}

TEST_CASE("opening and rejecting files leaks no file descriptors or mappings") {
  TempDir dir;
  HostAllocator host;
  save_safetensors(dir.file("good.safetensors"), {{"a", patterned({64}, DType::f32, host, 1)}});
  std::string bad = write_raw(dir, "{not json", "");
  auto open_descriptors = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator());
  };
  auto mappings = [] {
    std::ifstream maps("/proc/self/maps");
    return std::count(std::istreambuf_iterator<char>(maps), std::istreambuf_iterator<char>(), '\n');
  };
  auto open_and_reject = [&] {
    { Checkpoint checkpoint(dir.file("good.safetensors")); }
    error_of([&] { SafetensorsFile file(bad); });  // fails after mapping the file
    error_of([&] { SafetensorsFile file(dir.path); });  // a folder is not a file
  };
  open_and_reject();  // warm up: the first error may make the runtime map something
  auto descriptors_before = open_descriptors();
  auto mappings_before = mappings();
  for (int i = 0; i < 50; ++i) open_and_reject();
  CHECK(open_descriptors() == descriptors_before);
  CHECK(mappings() == mappings_before);
}
