// One training micro-batch over examples packed (padding-free) or padded,
// for the packing tests on every backend (tests/test_packing.cpp on the
// CPU, tests/emu/test_cuda_training.cpp under the emulator and on a GPU).
#pragma once
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/safetensors.h"
#include "tests/parity.h"
#include "trainer/data/data.h"

namespace ft::packing_test {

constexpr int64_t kSeqLen = 16;

// Examples of lengths that leave room to pack (and one that fills a row):
// random tokens, the first third a prompt without loss.
inline TokenizedDataset random_examples(int64_t vocab_size) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(4, int32_t(vocab_size) - 1);
  TokenizedDataset data;
  for (int64_t length : {9, 4, 13, 6, 2, 11, 7, 17, 3}) {
    TokenSequence example;
    for (int64_t t = 0; t < length; ++t) {
      example.tokens.push_back(token(rng));
      example.loss_mask.push_back(t > 0 && t >= length / 3 ? 1 : 0);
    }
    data.examples.push_back(example);
  }
  return data;
}

struct StepResult {
  float loss = 0.0f;
  int64_t rows = 0;
  std::vector<Tensor> grads;  // host f32, every adapter
};

// One forward_backward of the fixture (a folder with config.json and
// weights) with LoRA (no dropout) on every linear over all of
// random_examples in one micro-batch, rows made with `packing`; without
// keep_positions the packed rows run with no position_ids (attention
// crossing the examples). host must outlive the result.
inline StepResult train_step(Backend& backend, Allocator& host, const std::string& fixture_dir, Packing packing,
                             DType activation_dtype = DType::f32, bool keep_positions = true) {
  const ModelConfig config = read_model_config(fixture_dir + "/config.json");
  ModelOptions options;
  options.activation_dtype = activation_dtype;
  options.lora = LoraOptions{.r = 4, .lora_dropout = 0.0, .target_modules = parity::all_linear_modules(config)};
  std::unique_ptr<CausalLM> model = make_causal_lm(config, backend, options);
  model->load(Checkpoint(fixture_dir));
  model->init_adapters(3);
  parity::set_lora_B(*model);
  model->set_trainable([](const std::string& name) { return name.find(".lora_") != std::string::npos; });

  std::vector<TokenSequence> rows = make_rows(random_examples(config.vocab_size), kSeqLen, packing);
  const int64_t row_count = int64_t(rows.size());
  DataLoader loader(std::move(rows), row_count, kSeqLen, 3, 1, host);
  const Batch batch = loader.batch_in_order(0);
  StepResult result{0.0f, row_count, {}};
  result.loss = model->forward_backward(batch.input_ids, batch.targets, 1.0f,
                                        keep_positions ? batch.positions() : nullptr);
  for (Parameter& p : model->adapters()) {
    Tensor grad = Tensor::empty(p.grad.shape, DType::f32, host, MemCategory::gradients);
    backend.copy(grad, p.grad);
    result.grads.push_back(grad);
  }
  return result;
}

}  // namespace ft::packing_test
