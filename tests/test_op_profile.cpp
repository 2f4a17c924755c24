// FT_PROFILE_OPS: the per-op profile of the CPU backend (kernels/op_profile.h)
// and the table a training run writes from it (trainer/report/op_profile_report.h).
// No timed assertions: which ops appear, their call counts, and that their
// shares of the step add up to at most all of it.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/onednn_gemm.h"
#include "trainer/report/op_profile_report.h"
#include "trainer/trainer.h"

namespace fs = std::filesystem;
using namespace ft;

namespace {

// A run of 3 steps on the tiny Llama fixture with an INT8 base and LoRA on
// every projection, into a fresh output folder; FT_PROFILE_OPS as given
// (null: unset).
fs::path train_tiny(const std::string& name, const char* profile_ops) {
  const fs::path dir = fs::path(FT_BINARY_DIR) / "cli_runs" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string fixtures = FT_FIXTURES_DIR;
  const std::string yaml = "model: " + fixtures + "/llama_gqa\ntokenizer: " + fixtures +
                           "/tokenizer/tokenizer.model\ndata: {train: " + FT_SOURCE_DIR +
                           "/configs/data/pretrain.jsonl, packing: true}\nseq_len: 64\nmicro_batch_size: 4\n"
                           "quantization: {mode: int8}\nlora: {r: 4, lora_alpha: 8, lora_dropout: 0.1, "
                           "target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}\n"
                           "device: cpu\nmax_steps: 3\nsave_every: 0\ntask_metric: none\n"
                           "generate: {num_samples: 0}\noutput_dir: " + (dir / "out").string() + "\n";
  const TrainConfig config = parse_train_config(yaml, (dir / "config.yaml").string());
  if (profile_ops)
    setenv("FT_PROFILE_OPS", profile_ops, 1);
  else
    unsetenv("FT_PROFILE_OPS");
  REQUIRE(run_training(config, {}) == 0);
  unsetenv("FT_PROFILE_OPS");
  return dir / "out";
}

Tensor filled(Backend& backend, const Shape& shape, DType dtype, float value) {
  Tensor t = backend.empty(shape, dtype, MemCategory::activations);
  backend.fill(t, value);
  return t;
}

}  // namespace

TEST_CASE("a profiled training run writes every step op's time, calls and kernel") {
  const fs::path out = train_tiny("op_profile_on", "1");
  std::ifstream file(out / "op_profile.json");
  REQUIRE(file.good());
  const nlohmann::json profile = nlohmann::json::parse(file);
  CHECK(profile["steps"] == 2);  // the first step is left out
  std::set<std::string> ops;
  double shares = 0.0;
  for (const nlohmann::json& row : profile["ops"]) {
    ops.insert(row["op"].get<std::string>());
    CHECK(row["calls"].get<int64_t>() > 0);
    CHECK(row["seconds"].get<double>() >= 0.0);
    CHECK(!row["path"].get<std::string>().empty());
    shares += row["share"].get<double>();
  }
  for (const char* op : {"int8_linear_forward", "int8_linear_backward", "matmul", "attention_forward",
                         "attention_backward", "cross_entropy", "adamw_update_many", "dropout_forward"})
    CHECK_MESSAGE(ops.count(op) == 1, op);
  // The ops run one after another inside the steps, so their times add up to
  // at most the steps' wall time; on the CPU the step's work is in them.
  CHECK(shares <= 1.0);
  CHECK(profile["ops_share"].get<double>() == doctest::Approx(shares));
  CHECK(shares > 0.5);
}

TEST_CASE("an unprofiled run writes no profile, and FT_PROFILE_OPS takes only 1 or 0") {
  CHECK(!fs::exists(train_tiny("op_profile_off", nullptr) / "op_profile.json"));
  CHECK(!fs::exists(train_tiny("op_profile_zero", "0") / "op_profile.json"));
  setenv("FT_PROFILE_OPS", "yes", 1);
  CHECK_THROWS_WITH(op_profile_requested(), "FT_PROFILE_OPS: expected 1 (or 0), got 'yes'");
  unsetenv("FT_PROFILE_OPS");
}

TEST_CASE("an op called inside another counts as the outer op, and nothing is recorded once detached") {
  HostAllocator host;
  CpuBackend backend(host);
  OpProfile profile;
  Tensor dout = filled(backend, {3, 5}, DType::f32, 1.0f), dx = filled(backend, {3, 7}, DType::f32, 0.0f);
  Tensor weight = filled(backend, {5, 7}, DType::i8, 2.0f), scales = filled(backend, {5}, DType::f32, 1.0f);
  const Tensor b = filled(backend, {5, 7}, DType::f32, 1.0f);
  backend.set_op_profile(&profile);
  backend.int8_linear_backward(dx, dout, weight, scales, true);  // runs matmul and copy_columns inside
  backend.matmul(dx, dout, b, false, false);
  backend.set_op_profile(nullptr);
  backend.matmul(dx, dout, b, false, false);
  const std::vector<OpProfile::Row> rows = profile.rows();
  REQUIRE(rows.size() == 2);
  // oneDNN's matmul runs where it is row-independent (onednn_gemm.h).
  const bool onednn = backend.gemm() == CpuGemm::onednn && OnednnGemm().rows_independent();
  const std::string gemm = onednn ? "oneDNN f32 " : "reference f32 tiles";
  for (const OpProfile::Row& row : rows) {
    CHECK((row.op == "int8_linear_backward" || row.op == "matmul"));
    CHECK(row.calls == 1);
    CHECK(row.path.rfind(gemm, 0) == 0);  // the backward's path is its matmul's
  }
}
