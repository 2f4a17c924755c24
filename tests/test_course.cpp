// `finetune course` against figures computed independently with PyTorch,
// transformers and PEFT (scripts/make_course_fixture.py writes
// fixtures/course/expected.json).
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "trainer/cli/course.h"

namespace {

const std::string kConfigs = std::string(FT_SOURCE_DIR) + "/configs";

const nlohmann::json& expected() {
  static const nlohmann::json figures =
      nlohmann::json::parse(std::ifstream(std::string(FT_FIXTURES_DIR) + "/course/expected.json"));
  return figures;
}

const ft::CourseFigures& figures() {
  static const ft::CourseFigures computed = ft::course_figures(kConfigs);
  return computed;
}

}  // namespace

TEST_CASE("pi and the ranges of FP32, FP16, BF16 and INT8 are PyTorch's") {
  const char* keys[] = {"fp32", "fp16", "bf16", "int8"};
  REQUIRE(figures().dtypes.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    const ft::DTypeFigures& d = figures().dtypes[i];
    const nlohmann::json& want = expected()["dtypes"][keys[i]];
    CAPTURE(d.name);
    CHECK(d.bytes == want["bytes"].get<size_t>());
    CHECK(d.pi == want["pi"].get<double>());
    CHECK(d.lowest == want["min"].get<double>());
    CHECK(d.highest == want["max"].get<double>());
  }
}

TEST_CASE("the course's rule: bytes per parameter to store and to train") {
  const nlohmann::json& rule = expected()["rule"];
  CHECK(figures().rule.store() == rule["store_bytes_per_param"].get<size_t>());
  CHECK(figures().rule.train() == rule["train_bytes_per_param"].get<size_t>());
  std::ostringstream out;
  ft::print_course(figures(), kConfigs, out);
  for (const nlohmann::json& size : rule["sizes"]) {
    const std::string billions = std::to_string(size["params"].get<int64_t>() / 1000000000) + "B";
    CAPTURE(billions);
    CHECK(size["store_bytes"].get<int64_t>() == size["params"].get<int64_t>() * int64_t(figures().rule.store()));
    CHECK(size["train_bytes"].get<int64_t>() == size["params"].get<int64_t>() * int64_t(figures().rule.train()));
  }
  // The course's own figures, as printed.
  for (const char* text : {"4 GB", "24 GB", "700 GB", "4,200 GB", "2,000 GB", "12,000 GB"})
    CHECK_MESSAGE(out.str().find(text) != std::string::npos, text);
}

TEST_CASE("the planner's FP32 full fine-tuning of a 1B model holds 16 bytes per parameter besides activations") {
  const int64_t params = expected()["pythia_1b_params"].get<int64_t>();
  CHECK(figures().one_b_params.all == params);
  const ft::MemoryStats& s = figures().one_b_full_fp32.at_peak;
  // FP32 weights, FP32 gradients, AdamW's two FP32 moments, no masters (the weights are FP32 already).
  CHECK(s.current(ft::MemCategory::weights) == size_t(4 * params));
  CHECK(s.current(ft::MemCategory::gradients) == size_t(4 * params));
  CHECK(s.current(ft::MemCategory::optimizer) == size_t(8 * params));
  CHECK(s.current(ft::MemCategory::activations) > 0);
  // LoRA over INT8 holds far less than the full step.
  CHECK(figures().one_b_lora_int8.total_bytes() * 4 < figures().one_b_full_fp32.total_bytes());
}

TEST_CASE("a 20B model at 32, 16, 8 and 4 bits with the formats' overheads") {
  const nlohmann::json& want = expected()["neox_20b"];
  CHECK(figures().twenty_b_params.all == want["params"].get<int64_t>());
  REQUIRE(figures().twenty_b.size() == 4);
  for (const ft::WeightFormat& w : figures().twenty_b) {
    CAPTURE(w.bits);
    CHECK(w.bytes() == want["bytes"][std::to_string(w.bits)].get<size_t>());
  }
}

TEST_CASE("LoRA's examples: a 512 x 64 weight at r=8, and FLAN-T5-base at r=32 on q and v as PEFT prints it") {
  CHECK(figures().lora_512x64_trainable == expected()["lora_512x64"]["trainable"].get<int64_t>());
  CHECK(figures().lora_512x64_base == expected()["lora_512x64"]["base"].get<int64_t>());
  const std::string peft_line = expected()["flan_t5_base"]["line"].get<std::string>();
  CHECK(ft::trainable_parameters_line(figures().flan_t5_base) == peft_line);
  std::ostringstream out;
  ft::print_course(figures(), kConfigs, out);
  CHECK(out.str().find("\n  " + peft_line + "\n") != std::string::npos);
}

TEST_CASE("the labs are listed with the config files that run them") {
  std::ostringstream out;
  ft::print_course(figures(), kConfigs, out);
  for (const char* lab : {"course-lab2.yaml", "course-lab3.yaml"}) {
    CAPTURE(lab);
    CHECK(out.str().find("./finetune " + std::string(kConfigs) + "/" + lab + "\n") != std::string::npos);
  }
  CHECK(out.str().find("not found") == std::string::npos);
}

TEST_CASE("a folder without the model configs is an error naming the file") {
  try {
    ft::course_figures("/nonexistent/configs");
    FAIL("no error");
  } catch (const ft::Error& error) {
    CHECK(std::string(error.what()).find("/nonexistent/configs/pythia-1b/config.json") != std::string::npos);
  }
}
