// LoRA over a frozen INT8 base trains the adapters and nothing else: the
// optimizer holds state for exactly the trainable parameters, and every base
// byte is unchanged after training.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/quant/int8.h"
#include "model/safetensors.h"
#include "trainer/optimizer.h"
#include "trainer/train_state.h"

using namespace ft;

namespace {

const std::string kFixture = std::string(FT_FIXTURES_DIR) + "/llama_gqa";

std::vector<char> bytes_of(const Tensor& t) {
  const char* data = static_cast<const char*>(t.data);
  return std::vector<char>(data, data + t.size_bytes());
}

// A fixed batch: ids from a simple pattern, every next token a target.
void make_batch(Tensor& ids, Tensor& targets) {
  const int64_t B = ids.dim(0), T = ids.dim(1);
  for (int64_t i = 0; i < B * T; ++i) ids.ptr<int32_t>()[i] = int32_t(4 + (i * 37) % 316);
  for (int64_t i = 0; i < B * T; ++i) targets.ptr<int32_t>()[i] = (i + 1) % T ? ids.ptr<int32_t>()[i + 1] : -100;
}

int64_t trainable_count(CausalLM& model) {
  int64_t count = 0;
  for (std::deque<Parameter>* list : {&model.parameters(), &model.adapters()})
    for (Parameter& p : *list)
      if (p.trainable()) count += p.value.numel();
  return count;
}

std::vector<Parameter*> trainable_parameters(CausalLM& model) {
  std::vector<Parameter*> list;
  for (std::deque<Parameter>* group : {&model.parameters(), &model.adapters()})
    for (Parameter& p : *group)
      if (p.trainable()) list.push_back(&p);
  return list;
}

}  // namespace

TEST_CASE("INT8 base + LoRA: optimizer state is 8 bytes per adapter parameter and the base never changes") {
  HostAllocator host;
  TrackingAllocator tracker(host);
  CpuBackend backend(tracker);
  ModelOptions options;
  options.quantized_base = QuantizedBase::int8;
  options.lora = LoraOptions{.r = 4, .lora_alpha = 8.0, .lora_dropout = 0.1, .target_modules = {"q_proj", "v_proj"}};
  auto model = make_causal_lm(read_model_config(kFixture + "/config.json"), backend, options);
  model->load(Checkpoint(kFixture));
  model->init_adapters(7);
  model->set_trainable([](const std::string& name) { return name.find(".lora_") != std::string::npos; });
  std::vector<std::vector<char>> base_before;
  for (Parameter& p : model->parameters()) {
    CHECK_FALSE(p.trainable());
    base_before.push_back(bytes_of(p.value));
    if (p.value.dtype == DType::i8) base_before.push_back(bytes_of(int8_scales(p)));
  }

  const size_t optimizer_before = tracker.stats().current(MemCategory::optimizer);
  AdamW optimizer(backend, trainable_parameters(*model), AdamWOptions{});
  const int64_t trainable = trainable_count(*model);
  CHECK(trainable == 2 * (4 * (64 + 64) + 4 * (64 + 32)));
  // Two f32 moments per trainable parameter; adapters are f32, so no masters.
  CHECK(tracker.stats().current(MemCategory::optimizer) - optimizer_before == size_t(2 * 4 * trainable));

  Tensor ids = Tensor::empty({2, 13}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({2, 13}, DType::i32, host, MemCategory::activations);
  make_batch(ids, targets);
  std::vector<char> lora_B_before = bytes_of(model->parameter("model.layers.0.self_attn.q_proj.lora_B.weight").value);
  float first_loss = 0.0f, last_loss = 0.0f;
  for (int step = 0; step < 10; ++step) {
    model->zero_grads();
    model->set_dropout_seed(uint64_t(step));
    last_loss = model->forward_backward(ids, targets);
    if (step == 0) first_loss = last_loss;
    optimizer.step(1e-2);
  }
  CHECK(last_loss < first_loss);  // the adapters did learn
  CHECK(bytes_of(model->parameter("model.layers.0.self_attn.q_proj.lora_B.weight").value) != lora_B_before);
  size_t index = 0;
  for (Parameter& p : model->parameters()) {
    CAPTURE(p.name);
    CHECK(bytes_of(p.value) == base_before[index++]);
    if (p.value.dtype == DType::i8) CHECK(bytes_of(int8_scales(p)) == base_before[index++]);
  }
}

TEST_CASE("full training with BF16 weights keeps f32 masters: 12 bytes of optimizer state per parameter") {
  HostAllocator host;
  TrackingAllocator tracker(host);
  CpuBackend backend(tracker);
  ModelOptions options;
  options.weight_dtype = DType::bf16;
  auto model = make_causal_lm(read_model_config(kFixture + "/config.json"), backend, options);
  model->load(Checkpoint(kFixture));
  model->set_trainable([](const std::string&) { return true; });
  AdamW optimizer(backend, trainable_parameters(*model), AdamWOptions{});
  const int64_t trainable = trainable_count(*model);
  CHECK(tracker.stats().current(MemCategory::optimizer) == size_t(12 * trainable));
  // The bf16 compute copy follows the f32 master after a step.
  Tensor ids = Tensor::empty({1, 9}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({1, 9}, DType::i32, host, MemCategory::activations);
  make_batch(ids, targets);
  model->forward_backward(ids, targets);
  optimizer.step(1e-3);
  Tensor& master = optimizer.master(0);
  const Tensor& compute = optimizer.parameters()[0]->value;
  for (int64_t i = 0; i < compute.numel(); i += 97)
    CHECK(bf16_to_f32(compute.ptr<uint16_t>()[i]) == bf16_to_f32(f32_to_bf16(master.ptr<float>()[i])));
}

// offload.optimizer: host (ZeRO-Offload's split). The same model trained
// three steps with AdamW's state on the device and in host memory, streamed
// through staging chunks of 1000 elements (so chunks split parameters), ends
// with the same bits in every weight, master and moment; the offloaded state
// is 12 bytes per parameter in host memory and none on the device.
TEST_CASE("offloaded AdamW state trains bit for bit as resident state, from host memory") {
  HostAllocator host;
  const ModelConfig config = read_model_config(kFixture + "/config.json");
  ModelOptions options;
  options.weight_dtype = DType::bf16;
  TrackingAllocator resident_tracker(host), offload_tracker(host), host_state(host);
  CpuBackend resident_backend(resident_tracker), offload_backend(offload_tracker);
  auto resident = make_causal_lm(config, resident_backend, options);
  auto offloaded = make_causal_lm(config, offload_backend, options);
  AdamWOptions offload_options;
  offload_options.host_state = &host_state;
  offload_options.offload_chunk_elements = 1000;
  std::unique_ptr<AdamW> optimizers[2];
  CausalLM* models[2] = {resident.get(), offloaded.get()};
  for (int k = 0; k < 2; ++k) {
    models[k]->load(Checkpoint(kFixture));
    models[k]->set_trainable([](const std::string&) { return true; });
    optimizers[k] = std::make_unique<AdamW>(k ? offload_backend : resident_backend, trainable_parameters(*models[k]),
                                            k ? offload_options : AdamWOptions{});
  }
  const int64_t trainable = trainable_count(*offloaded);
  CHECK(host_state.stats().current(MemCategory::optimizer) == size_t(12 * trainable));
  CHECK(offload_tracker.stats().current(MemCategory::optimizer) == 0);
  CHECK(resident_tracker.stats().current(MemCategory::optimizer) == size_t(12 * trainable));
  Tensor ids = Tensor::empty({2, 9}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({2, 9}, DType::i32, host, MemCategory::activations);
  make_batch(ids, targets);
  const std::vector<char> master_before = bytes_of(optimizers[1]->master(0));
  for (int step = 0; step < 3; ++step)
    for (int k = 0; k < 2; ++k) {
      models[k]->zero_grads();
      models[k]->forward_backward(ids, targets);
      optimizers[k]->step(1e-2);
    }
  for (size_t i = 0; i < optimizers[0]->parameters().size(); ++i) {
    CAPTURE(optimizers[0]->parameters()[i]->name);
    CHECK(bytes_of(optimizers[0]->parameters()[i]->value) == bytes_of(optimizers[1]->parameters()[i]->value));
    CHECK(bytes_of(optimizers[0]->master(i)) == bytes_of(optimizers[1]->master(i)));
    CHECK(bytes_of(optimizers[0]->first_moment(i)) == bytes_of(optimizers[1]->first_moment(i)));
    CHECK(bytes_of(optimizers[0]->second_moment(i)) == bytes_of(optimizers[1]->second_moment(i)));
  }
  // The weights moved (a no-op optimizer would pass the checks above).
  CHECK(bytes_of(optimizers[1]->master(0)) != master_before);
}

// A training state saved from host-resident AdamW state resumes exactly,
// into offloaded state (a memory copy on the host) and into resident state
// (the backend's copy): masters, moments and the bf16 compute copies made
// from the masters all equal the saved run's.
TEST_CASE("an offloaded optimizer's state saves and resumes exactly, offloaded or resident") {
  HostAllocator host;
  const ModelConfig config = read_model_config(kFixture + "/config.json");
  ModelOptions options;
  options.weight_dtype = DType::bf16;
  CpuBackend backend(host);
  AdamWOptions offload_options;
  offload_options.host_state = &host;
  offload_options.offload_chunk_elements = 777;
  std::unique_ptr<CausalLM> models[3];
  std::unique_ptr<AdamW> optimizers[3];  // saved from, resumed offloaded, resumed resident
  for (int k = 0; k < 3; ++k) {
    models[k] = make_causal_lm(config, backend, options);
    models[k]->load(Checkpoint(kFixture));
    models[k]->set_trainable([](const std::string&) { return true; });
    optimizers[k] =
        std::make_unique<AdamW>(backend, trainable_parameters(*models[k]), k < 2 ? offload_options : AdamWOptions{});
  }
  Tensor ids = Tensor::empty({2, 9}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({2, 9}, DType::i32, host, MemCategory::activations);
  make_batch(ids, targets);
  for (int step = 0; step < 2; ++step) {
    models[0]->zero_grads();
    models[0]->forward_backward(ids, targets);
    optimizers[0]->step(1e-2);
  }
  const std::string path = std::string(FT_BINARY_DIR) + "/offloaded_train_state.safetensors";
  save_train_state(path, *optimizers[0], {2, {0, 0}, {}, ""}, {});
  for (int k = 1; k < 3; ++k) {
    CAPTURE(k);
    CHECK(load_train_state(path, *optimizers[k], {}).step == 2);
    CHECK(optimizers[k]->steps_taken() == 2);
    for (size_t i = 0; i < optimizers[0]->parameters().size(); ++i) {
      CAPTURE(optimizers[0]->parameters()[i]->name);
      CHECK(bytes_of(optimizers[k]->parameters()[i]->value) == bytes_of(optimizers[0]->parameters()[i]->value));
      CHECK(bytes_of(optimizers[k]->master(i)) == bytes_of(optimizers[0]->master(i)));
      CHECK(bytes_of(optimizers[k]->first_moment(i)) == bytes_of(optimizers[0]->first_moment(i)));
      CHECK(bytes_of(optimizers[k]->second_moment(i)) == bytes_of(optimizers[0]->second_moment(i)));
    }
  }
}
