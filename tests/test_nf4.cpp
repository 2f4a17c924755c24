// NF4 against bitsandbytes itself (tests/fixtures/nf4/, written by
// scripts/make_nf4_fixtures.py with bnb.functional.quantize_4bit /
// dequantize_4bit on the CPU): codes, absmax and the double-quantised
// constants bit-identical, dequantised values within 1 ulp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/nf4.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/quant/nf4.h"
#include "model/quantized_base.h"
#include "model/safetensors.h"
#include "tests/host_tensors.h"

namespace ft {
namespace {

using testing::same_bytes;

const std::string kFixtures = FT_FIXTURES_DIR;
const std::string kBlocks = kFixtures + "/nf4/blocks.safetensors";

template <class T>
std::vector<T> values_of(const Checkpoint& file, const std::string& name) {
  Tensor t = file.view(name);
  std::vector<T> values(size_t(t.numel()));
  std::memcpy(values.data(), t.data, values.size() * sizeof(T));
  return values;
}

std::vector<float> floats_of(const Checkpoint& file, const std::string& name) {
  Tensor t = file.view(name);
  std::vector<float> values(size_t(t.numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = load_as_f32(t.data, t.dtype, int64_t(i));
  return values;
}

// Units in the last place of f32 between a and b (same sign or zero).
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = int32_t(0x80000000u) - ia;
  if (ib < 0) ib = int32_t(0x80000000u) - ib;
  return std::abs(int64_t(ia) - int64_t(ib));
}

TEST_CASE("NF4 code table and the dynamic map are bitsandbytes' own") {
  Checkpoint file(kBlocks);
  std::vector<float> quant_map = values_of<float>(file, "weight.quant_map");
  REQUIRE(quant_map.size() == 16);
  for (int i = 0; i < 16; ++i) CHECK(quant_map[i] == kNf4Codes[i]);
  std::vector<float> nested = values_of<float>(file, "weight.nested_quant_map");
  std::vector<float> ours = dynamic_map_8bit();
  REQUIRE(nested.size() == 256);
  int64_t differing = 0;
  for (size_t i = 0; i < 256; ++i) differing += nested[i] != ours[i];
  CHECK(differing == 0);
}

TEST_CASE("nf4_quantize: codes and absmax bit-identical to bitsandbytes, ties included") {
  Checkpoint file(kBlocks);
  std::vector<float> x = values_of<float>(file, "input");
  std::vector<uint8_t> packed(size_t(nf4_packed_bytes(int64_t(x.size()))));
  std::vector<float> absmax(size_t(nf4_blocks(int64_t(x.size()))));
  nf4_quantize(x.data(), int64_t(x.size()), packed.data(), absmax.data());
  std::vector<uint8_t> want = values_of<uint8_t>(file, "weight");
  REQUIRE(want.size() == packed.size());
  int64_t differing = 0;
  for (size_t i = 0; i < packed.size(); ++i) differing += packed[i] != want[i];
  CHECK(differing == 0);
  // The tie block (row 0, first 64): midpoints go to the lower code.
  for (int i = 1; i < 16; ++i) CHECK(nf4_index(packed.data(), i) == i - 1);
  CHECK(values_of<uint8_t>(file, "plain") == want);
  CHECK(values_of<float>(file, "plain.absmax") == absmax);
}

TEST_CASE("nf4_double_quantize: offset, nested absmax and codes bit-identical to bitsandbytes") {
  Checkpoint file(kBlocks);
  std::vector<float> absmax = values_of<float>(file, "plain.absmax");
  Nf4DoubleQuant q = nf4_double_quantize(absmax.data(), int64_t(absmax.size()), dynamic_map_8bit());
  const Tensor state = file.view("weight.quant_state.bitsandbytes__nf4");
  const std::string json(static_cast<const char*>(state.data), size_t(state.numel()));
  // The JSON carries the offset as a Python float printed from the f32 value.
  const size_t at = json.find("\"nested_offset\": ");
  REQUIRE(at != std::string::npos);
  CHECK(float(std::stod(json.substr(at + 17))) == q.offset);
  CHECK(values_of<float>(file, "weight.nested_absmax") == q.nested_absmax);
  std::vector<uint8_t> want = values_of<uint8_t>(file, "weight.absmax");
  REQUIRE(want.size() == q.codes.size());
  int64_t differing = 0;
  for (size_t i = 0; i < want.size(); ++i) differing += want[i] != q.codes[i];
  CHECK(differing == 0);
}

TEST_CASE("NF4 dequantisation within 1 ulp of bitsandbytes' dequantize_4bit (f32 and bf16)") {
  Checkpoint file(kBlocks);
  std::vector<uint8_t> packed = values_of<uint8_t>(file, "weight");
  std::vector<uint8_t> codes = values_of<uint8_t>(file, "weight.absmax");
  std::vector<float> nested = values_of<float>(file, "weight.nested_absmax");
  std::vector<float> map = values_of<float>(file, "weight.nested_quant_map");
  std::vector<float> plain_absmax = values_of<float>(file, "plain.absmax");
  Nf4DoubleQuant q = nf4_double_quantize(plain_absmax.data(), int64_t(plain_absmax.size()), map);
  std::vector<float> absmax(codes.size());
  nf4_dequantize_absmax(absmax.data(), codes.data(), int64_t(codes.size()), nested.data(), map.data(), q.offset);
  std::vector<float> f32 = floats_of(file, "dequant_f32"), bf16 = floats_of(file, "dequant_bf16");
  std::vector<float> plain = floats_of(file, "plain.dequant_f32");
  int64_t worst_f32 = 0, worst_bf16 = 0, plain_differing = 0;
  for (int64_t e = 0; e < int64_t(f32.size()); ++e) {
    const float v = nf4_value(packed.data(), absmax.data(), e);
    worst_f32 = std::max(worst_f32, ulps(v, f32[e]));
    worst_bf16 = std::max(worst_bf16, ulps(bf16_to_f32(f32_to_bf16(v)), bf16[e]) >> 16);
    plain_differing += nf4_value(packed.data(), plain_absmax.data(), e) != plain[e];
  }
  CHECK(worst_f32 <= 1);
  CHECK(worst_bf16 <= 1);
  CHECK(plain_differing == 0);
}

// ---- the NF4 linear ops and NF4 models --------------------------------------

// A random NF4 weight [O, K] on the CPU backend, double-quantised or not.
Parameter random_nf4(Backend& backend, int64_t O, int64_t K, bool double_quant, uint32_t seed) {
  Parameter p;
  p.name.push_back('w');  // (assigning a literal trips a GCC 12 -Wrestrict false positive)
  allocate_nf4_parameter(backend.allocator(), p, O, K, double_quant);
  quantize_nf4_parameter(backend, p, testing::make(backend, {O, K}, testing::gaussian(O * K, 0.02f, seed)));
  return p;
}

// The weight dequantised in float64 from the host rules (kernels/nf4.h).
std::vector<double> dequantised(const Parameter& p) {
  const Nf4Weight weight = nf4_weight(p);
  const int64_t n = weight.out_features * weight.in_features, blocks = nf4_blocks(n);
  std::vector<float> absmax(static_cast<size_t>(blocks));
  if (weight.double_quant())
    nf4_dequantize_absmax(absmax.data(), weight.absmax->ptr<const uint8_t>(), blocks,
                          weight.nested_absmax->ptr<const float>(), weight.nested_map->ptr<const float>(),
                          weight.nested_offset);
  else
    std::memcpy(absmax.data(), weight.absmax->data, absmax.size() * 4);
  std::vector<double> w(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) w[e] = nf4_value(p.value.ptr<const uint8_t>(), absmax.data(), e);
  return w;
}

// Forward and backward against float64 products of the dequantised weight,
// on a layer large enough for several tiles each way (O * K > the 4 Mi
// element tile) with K not a multiple of 64 (blocks straddle rows).
TEST_CASE("nf4_linear_forward / nf4_linear_backward match float64 products over several tiles") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = 3, K = 4100, O = 1100;
  for (bool double_quant : {true, false}) {
    CAPTURE(double_quant);
    Parameter p = random_nf4(backend, O, K, double_quant, 7);
    const std::vector<double> w = dequantised(p);
    const std::vector<float> xv = testing::gaussian(N * K, 1.0f, 8), dv = testing::gaussian(N * O, 1.0f, 9);
    Tensor x = testing::make(backend, {N, K}, xv), dout = testing::make(backend, {N, O}, dv);
    Tensor out = backend.empty({N, O}, DType::f32, MemCategory::activations);
    backend.nf4_linear_forward(out, x, nf4_weight(p));
    Tensor dx = testing::make(backend, {N, K}, std::vector<float>(size_t(N * K), 0.5f));
    backend.nf4_linear_backward(dx, dout, nf4_weight(p), true);
    double worst_out = 0, worst_dx = 0;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < O; ++o) {
        double want = 0;
        for (int64_t k = 0; k < K; ++k) want += double(xv[n * K + k]) * w[o * K + k];
        worst_out = std::max(worst_out, std::fabs(out.ptr<float>()[n * O + o] - want));
      }
      for (int64_t k = 0; k < K; ++k) {
        double want = 0.5;
        for (int64_t o = 0; o < O; ++o) want += double(dv[n * O + o]) * w[o * K + k];
        worst_dx = std::max(worst_dx, std::fabs(dx.ptr<float>()[n * K + k] - want));
      }
    }
    CHECK(worst_out < 2e-4);  // sums of ~4100 products of size ~0.02, f32 accumulation
    CHECK(worst_dx < 2e-4);
  }
}

TEST_CASE("NF4 op contract: a wrong absmax dtype or shape is one clear error") {
  HostAllocator host;
  CpuBackend backend(host);
  Parameter p = random_nf4(backend, 8, 64, true, 1);
  Nf4Weight w = nf4_weight(p);
  Tensor x = backend.empty({2, 64}, DType::f32, MemCategory::activations);
  Tensor out = backend.empty({2, 8}, DType::f32, MemCategory::activations);
  Nf4Weight plain = w;
  plain.nested_map = nullptr;
  CHECK_THROWS_WITH(backend.nf4_linear_forward(out, x, plain), doctest::Contains("nested_absmax and nested_map"));
  Nf4Weight wide = w;
  wide.in_features = 65;
  CHECK_THROWS_WITH(backend.nf4_linear_forward(out, x, wide), doctest::Contains("codes"));
  Tensor tile = backend.empty({9, 64}, DType::f32, MemCategory::activations);
  CHECK_THROWS_WITH(backend.nf4_dequantize(tile, w, 0, 0), doctest::Contains("exceeds the weight"));
}

std::unique_ptr<CausalLM> nf4_llama(Backend& backend, const std::string& checkpoint) {
  ModelOptions options;
  options.quantized_base = QuantizedBase::nf4;
  auto model =
      make_causal_lm(read_model_config(kFixtures + "/llama_gqa/config.json"), backend, options);
  model->load(Checkpoint(checkpoint));
  return model;
}

int64_t differing_bytes(const Tensor& a, const Tensor& b) {
  REQUIRE(a.size_bytes() == b.size_bytes());
  int64_t differing = 0;
  for (size_t i = 0; i < a.size_bytes(); ++i)
    differing += static_cast<const uint8_t*>(a.data)[i] != static_cast<const uint8_t*>(b.data)[i];
  return differing;
}

// Everything bit-identical but the double-quantised absmax codes, whose
// differing count is returned (see the caller).
int64_t check_same_nf4(CausalLM& a, CausalLM& b) {
  int64_t nf4_parameters = 0, absmax_differing = 0;
  for (const Parameter& p : a.parameters()) {
    const Parameter& q = b.parameter(p.name);
    CAPTURE(p.name);
    CHECK(same_bytes(p.value, q.value));
    if (p.value.dtype != DType::u8) continue;
    ++nf4_parameters;
    const Nf4Weight w = nf4_weight(p), v = nf4_weight(q);
    absmax_differing += differing_bytes(*w.absmax, *v.absmax);
    CHECK(same_bytes(*w.nested_absmax, *v.nested_absmax));
    CHECK(same_bytes(*w.nested_map, *v.nested_map));
    CHECK(w.nested_offset == v.nested_offset);
  }
  CHECK(nf4_parameters == 2 * 7);
  return absmax_differing;
}

TEST_CASE("a transformers/bitsandbytes NF4 checkpoint loads bit-identical to quantising the f32 one here") {
  HostAllocator host;
  CpuBackend backend(host);
  auto from_bnb = nf4_llama(backend, kFixtures + "/nf4/llama_nf4");
  auto quantised_here = nf4_llama(backend, kFixtures + "/llama_gqa");
  // bitsandbytes' native CPU 8-bit quantiser finds the code by an
  // approximate bucket search (BinSearch's Direct2) and then compares only
  // that index and the next, so it can keep the second-nearest code; we take
  // the nearest. Here 1 of the 14 weights' 912 absmax codes: block 30 of
  // layer 1's v_proj, -0.0011121 / 0.085538, which bnb gives code 111
  // (-0.0012812, 1.691e-4 away) and we code 112 (-0.0009438, 1.684e-4 away).
  CHECK(check_same_nf4(*from_bnb, *quantised_here) == 1);

  // save_quantized_base writes the same tensors as bitsandbytes + transformers.
  const std::string saved = std::string(FT_BINARY_DIR) + "/nf4_saved_base.safetensors";
  save_quantized_base(*quantised_here, saved);
  Checkpoint ours(saved), theirs(kFixtures + "/nf4/llama_nf4/model.safetensors");
  CHECK(SafetensorsFile(saved).metadata().at(kQuantizationMetadataKey) == kQuantizationNf4);
  int64_t absmax_differing = 0;
  std::vector<std::string> names = ours.names(), bnb_names = theirs.names();
  std::sort(names.begin(), names.end());
  std::sort(bnb_names.begin(), bnb_names.end());
  CHECK(names == bnb_names);
  for (const std::string& name : bnb_names) {
    CAPTURE(name);
    if (!ours.contains(name)) continue;
    if (name.size() > 7 && name.compare(name.size() - 7, 7, ".absmax") == 0) {
      absmax_differing += differing_bytes(ours.view(name), theirs.view(name));
      continue;
    }
    if (name.find(".quant_state.") == std::string::npos) {
      CHECK(same_bytes(ours.view(name), theirs.view(name)));
      continue;
    }
    auto json_of = [](const Tensor& t) {
      return nlohmann::json::parse(std::string(static_cast<const char*>(t.data), size_t(t.numel())));
    };
    CHECK(json_of(ours.view(name)) == json_of(theirs.view(name)));
  }
  CHECK(absmax_differing == 1);  // the code above
  auto reloaded = nf4_llama(backend, saved);
  CHECK(check_same_nf4(*reloaded, *quantised_here) == 0);

  // The NF4 base in a model without one is refused by name.
  auto dense = make_causal_lm(read_model_config(kFixtures + "/llama_gqa/config.json"), backend, {});
  CHECK_THROWS_WITH(dense->load(Checkpoint(saved)), doctest::Contains("quantization.mode nf4"));
}

TEST_CASE("an NF4 model's logits equal a dense model's holding the dequantised weights") {
  HostAllocator host;
  CpuBackend backend(host);
  auto nf4 = nf4_llama(backend, kFixtures + "/nf4/llama_nf4");
  auto dense = make_causal_lm(read_model_config(kFixtures + "/llama_gqa/config.json"), backend, {});
  dense->load(Checkpoint(kFixtures + "/llama_gqa"));
  for (const Parameter& p : nf4->parameters())
    if (p.value.dtype == DType::u8) backend.nf4_dequantize(dense->parameter(p.name).value, nf4_weight(p), 0, 0);
  Tensor ids = Tensor::empty({2, 8}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({2, 8}, DType::i32, host, MemCategory::activations);
  for (int i = 0; i < 16; ++i) ids.ptr<int32_t>()[i] = (i * 37) % 320, targets.ptr<int32_t>()[i] = (i * 53) % 320;
  CHECK(nf4->forward(ids, targets) == dense->forward(ids, targets));
  CHECK(same_bytes(nf4->last_logits(), dense->last_logits()));
}

}  // namespace
}  // namespace ft
