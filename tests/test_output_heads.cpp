// Token log-probabilities and a value head in one forward and one backward,
// against PyTorch + PEFT in float64 (tests/fixtures/heads,
// scripts/make_heads_fixture.py): llama_gqa with the llama_lora adapter and
// trl's value head (v_head.summary) on the final hidden states. With fixed
// weights g on every target token's log-probability and value -- what an RL
// loss hands the model once trl's formulas have been differentiated -- our
// log-probabilities, values and the gradients of every LoRA tensor and of
// the value head equal the fixture's. The same on a seq2seq policy
// (tests/fixtures/heads/seq2seq_reference.safetensors): t5_v1_1 with its
// adapter, the value head on the decoder's last hidden states, the
// gradients through the decoder and, by cross-attention, the encoder. The
// value head's dropout (trl's summary_dropout_prob) against the head computed
// directly over the dropout op's kept, rescaled hidden states.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "kernels/cpu/cpu_backend.h"
#include "model/families.h"
#include "model/llama.h"
#include "model/output_head.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "model/t5.h"
#include "tests/parity.h"

using namespace ft;
using ft::parity::relative_error;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;
// f32 against float64: the forward's f32 rounding over two layers.
constexpr double kTolerance = 1e-4;

std::vector<float> floats(const Tensor& t) { return {t.ptr<float>(), t.ptr<float>() + t.numel()}; }

double worst_gap(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0.0, scale = 1e-6;
  for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, double(std::abs(want[i])));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])));
  return worst / scale;
}

// The adapter's LoRA and a value head.
ModelOptions value_head_options(const std::string& adapter) {
  ModelOptions options;
  options.lora = read_peft_adapter_config(adapter).lora;
  options.output_head = OutputHead::value;
  return options;
}

// The base and the adapter loaded, the fixture's value head copied in; the adapters and the head train.
void load_fixture_model(LanguageModel& model, const std::string& base, const std::string& adapter,
                        const Checkpoint& reference) {
  model.load(Checkpoint(base));
  load_peft_adapter(adapter, model);
  const HeadParameters& head = model.output_head();
  model.backend().copy(head.weight->value, reference.view("v_head.summary.weight"));
  model.backend().copy(head.bias->value, reference.view("v_head.summary.bias"));
  model.set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos || name.rfind("v_head.", 0) == 0; });
}

// What one backward is handed: the fixture's weights g on every token's
// log-probability (gradient) and value (value_head, which keeps the values).
struct FixtureHeads {
  std::vector<float> g_logp, g_value, values;
  TokenLogpsGradient gradient;
  HiddenHead value_head;
  FixtureHeads(LanguageModel& model, const Checkpoint& reference)
      : g_logp(floats(reference.view("g_logp"))), g_value(floats(reference.view("g_value"))) {
    gradient = [this](const std::vector<float>&) { return g_logp; };
    value_head = [this, &model](const Tensor& hidden, Tensor* dhidden) {
      values = head_outputs(model.backend(), model.output_head(), hidden);
      head_backward(model.backend(), model.output_head(), hidden, g_value, *dhidden);
    };
  }
};

// The log-probabilities, the values (on every position: torch's are kept on
// padding too) and every adapter's and the head's gradient against the fixture's.
void check_against_fixture(LanguageModel& model, const Checkpoint& reference, const std::vector<float>& logps,
                           const std::vector<float>& values) {
  CHECK(worst_gap(logps, floats(reference.view("logps"))) <= kTolerance);
  CHECK(worst_gap(values, floats(reference.view("values"))) <= kTolerance);
  for (Parameter& adapter : model.adapters()) {
    CAPTURE(adapter.name);
    CHECK(relative_error(adapter.grad, reference.view("grad." + adapter.name)) <= kTolerance);
  }
  const HeadParameters& head = model.output_head();
  CHECK(relative_error(head.weight->grad, reference.view("grad.v_head.summary.weight")) <= kTolerance);
  CHECK(relative_error(head.bias->grad, reference.view("grad.v_head.summary.bias")) <= kTolerance);
}

// The same forward in eval mode (eval_forward(head)) gives the same log-probabilities and values.
void check_eval_forward(LanguageModel& model, const std::vector<float>& logps, const std::vector<float>& values,
                        const std::function<std::vector<float>(const HiddenHead*)>& eval_forward) {
  std::vector<float> eval_values;
  const HiddenHead read_values = [&](const Tensor& hidden, Tensor*) {
    eval_values = head_outputs(model.backend(), model.output_head(), hidden);
  };
  CHECK(worst_gap(eval_forward(&read_values), logps) == 0.0);
  CHECK(eval_values == values);
}

// llama_gqa with the llama_lora adapter and the fixture's value head, on a CPU backend.
struct LlamaHeadsFixture {
  Checkpoint reference{kFixtures + "/heads/reference.safetensors"};
  HostAllocator host;
  CpuBackend backend{host};
  LlamaModel model;
  LlamaHeadsFixture()
      : model(read_model_config(kFixtures + "/llama_gqa/config.json"), backend,
              value_head_options(kFixtures + "/llama_lora/adapter")) {
    load_fixture_model(model, kFixtures + "/llama_gqa", kFixtures + "/llama_lora/adapter", reference);
  }
};

}  // namespace

TEST_CASE("log-probabilities and a value head through one backward equal PyTorch + PEFT") {
  LlamaHeadsFixture fixture;
  const Checkpoint& reference = fixture.reference;
  LlamaModel& model = fixture.model;
  const Tensor ids = reference.view("input_ids"), targets = reference.view("targets");
  FixtureHeads heads(model, reference);
  const std::vector<float> logps = model.token_logps_backward(ids, targets, heads.gradient, nullptr, &heads.value_head);
  check_against_fixture(model, reference, logps, heads.values);

  check_eval_forward(model, logps, heads.values,
                     [&](const HiddenHead* head) { return model.token_logps(ids, targets, nullptr, head); });
}

TEST_CASE("a seq2seq policy's decoder log-probabilities and value head through one backward equal PyTorch + PEFT") {
  Checkpoint reference(kFixtures + "/heads/seq2seq_reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  const std::string adapter = kFixtures + "/t5_v1_1/adapter";
  T5Model model(read_model_config(kFixtures + "/t5_v1_1/config.json"), backend, value_head_options(adapter));
  load_fixture_model(model, kFixtures + "/t5_v1_1", adapter, reference);
  const Tensor encoder_ids = reference.view("encoder_ids"), decoder_ids = reference.view("decoder_ids");
  const Tensor targets = reference.view("targets"), lengths = reference.view("encoder_lengths");
  const std::vector<int32_t> encoder_lengths(lengths.ptr<int32_t>(), lengths.ptr<int32_t>() + lengths.numel());
  FixtureHeads heads(model, reference);
  const std::vector<float> logps = model.token_logps_backward(encoder_ids, encoder_lengths, decoder_ids, targets,
                                                              heads.gradient, &heads.value_head);
  check_against_fixture(model, reference, logps, heads.values);
  int64_t encoder_adapters = 0;  // reached through cross-attention only
  for (const Parameter& p : model.adapters()) encoder_adapters += p.name.rfind("encoder.", 0) == 0;
  CHECK(encoder_adapters == 12);  // 3 encoder layers, q and v, A and B

  check_eval_forward(model, logps, heads.values, [&](const HiddenHead* head) {
    return model.token_logps(encoder_ids, encoder_lengths, decoder_ids, targets, head);
  });
}

TEST_CASE("the value head's dropout (trl's summary_dropout_prob): the head over the kept hidden states, rescaled") {
  LlamaHeadsFixture fixture;
  HostAllocator& host = fixture.host;
  CpuBackend& backend = fixture.backend;
  LlamaModel& model = fixture.model;
  model.zero_grads();
  const HeadParameters& head = model.output_head();
  const int64_t N = 7, C = model.config().hidden_size;
  Tensor hidden = Tensor::empty({N, C}, DType::f32, host, MemCategory::activations);
  for (int64_t i = 0; i < N * C; ++i) hidden.ptr<float>()[i] = float(std::sin(0.37 * double(i)));
  const HeadDropout dropout{0.25f, 1234};
  // The dropout op's mask over ones: 0 where dropped, 1 / (1 - p) where kept.
  Tensor ones = Tensor::empty({N, C}, DType::f32, host, MemCategory::activations);
  Tensor kept = Tensor::empty({N, C}, DType::f32, host, MemCategory::activations);
  std::fill_n(ones.ptr<float>(), N * C, 1.0f);
  backend.dropout_forward(kept, ones, dropout.p, dropout.seed);
  const std::vector<float> values = head_outputs(backend, head, hidden, dropout);
  std::vector<float> dout(size_t(N), 0.0f);
  for (int64_t n = 0; n < N; ++n) dout[size_t(n)] = float(n) - 2.5f;
  Tensor dhidden = Tensor::empty({N, C}, DType::f32, host, MemCategory::activations);
  std::fill_n(dhidden.ptr<float>(), N * C, 0.5f);  // accumulated into
  head_backward(backend, head, hidden, dout, dhidden, dropout);

  const float* w = head.weight->value.ptr<float>();
  const float* m = kept.ptr<float>();
  const float* x = hidden.ptr<float>();
  std::vector<float> want_values(size_t(N), 0.0f), want_dhidden(size_t(N * C)), want_dw(size_t(C), 0.0f);
  int64_t dropped = 0;
  double want_dbias = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    double sum = double(head.bias->value.ptr<float>()[0]);
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = n * C + c;
      dropped += m[i] == 0.0f ? 1 : 0;
      sum += double(x[i]) * double(m[i]) * double(w[c]);
      want_dhidden[size_t(i)] = float(0.5 + double(dout[size_t(n)]) * double(w[c]) * double(m[i]));
      want_dw[size_t(c)] += float(double(dout[size_t(n)]) * double(x[i]) * double(m[i]));
    }
    want_values[size_t(n)] = float(sum);
    want_dbias += dout[size_t(n)];
  }
  MESSAGE(dropped, " of ", N * C, " hidden values dropped at p ", dropout.p);
  CHECK(dropped > N * C / 8);
  CHECK(dropped < N * C / 2);
  CHECK(worst_gap(values, want_values) <= 1e-6);
  CHECK(worst_gap(floats(dhidden), want_dhidden) <= 1e-6);
  CHECK(worst_gap(floats(head.weight->grad), want_dw) <= 1e-6);
  CHECK(std::abs(head.bias->grad.ptr<float>()[0] - want_dbias) <= 1e-6 * std::abs(want_dbias));
  // Without dropout the head reads hidden itself.
  std::vector<float> undropped(size_t(N), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    double sum = double(head.bias->value.ptr<float>()[0]);
    for (int64_t c = 0; c < C; ++c) sum += double(x[n * C + c]) * double(w[c]);
    undropped[size_t(n)] = float(sum);
  }
  CHECK(worst_gap(head_outputs(backend, head, hidden), undropped) <= 1e-6);
}
