// The finetune binary as a user runs it: the PEFT-style parameter line, exact
// resume after kill -9, and clear errors with a non-zero exit for bad input.
// Uses the tiny llama_gqa fixture with the fixture tokenizer (vocab 320), and
// the Llama-3-style and Qwen2-style fixtures with their tokenizer.json.
#include <doctest/doctest.h>
#include <signal.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_device.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/lora_linear.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "parity.h"

namespace fs = std::filesystem;
using namespace ft;

namespace {

const std::string kBinary = FT_FINETUNE_BINARY;
// A run of the binary that takes longer has hung: it is killed and the test
// fails. 120 s in a plain build; more where the build's test timeout is raised
// (sanitizers make a run several times slower).
constexpr unsigned kRunTimeoutS = FT_TEST_TIMEOUT_S * 2 / 5;
const std::string kFixtures = FT_FIXTURES_DIR;

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

// Runs `command` with sh under coreutils' timeout: TERM after timeout_s (exit
// 124), KILL 10 s later (exit 137).
CommandResult run_command(const std::string& command, unsigned timeout_s = kRunTimeoutS) {
  std::string quoted = "'";
  for (char c : command) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string timed = "timeout -k 10 " + std::to_string(timeout_s) + " sh -c " + quoted + " 2>&1";
  CommandResult result{0, ""};
  FILE* pipe = popen(timed.c_str(), "r");
  REQUIRE(pipe);
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) result.output.append(buffer, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  REQUIRE_MESSAGE((result.exit_code != 124 && result.exit_code != 137), "timed out after ", timeout_s, " s: ", command, "\n", result.output);
  return result;
}

// A fresh folder under cli_runs holding train.jsonl and eval.jsonl: the first
// train_rows and the next eval_rows rows of configs/data/<data_file>.
fs::path fresh_run_dir(const std::string& name, const std::string& data_file, int train_rows, int eval_rows) {
  const fs::path dir = fs::path(FT_BINARY_DIR) / "cli_runs" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream source(std::string(FT_SOURCE_DIR) + "/configs/data/" + data_file);
  std::ofstream train(dir / "train.jsonl"), eval(dir / "eval.jsonl");
  std::string line;
  for (int i = 0; i < train_rows + eval_rows && std::getline(source, line); ++i)
    (i < train_rows ? train : eval) << line << "\n";
  return dir;
}

// A fresh folder with a config for the fixture model and a small text dataset.
std::string make_run_dir(const std::string& name, const std::string& extra_yaml = "") {
  const fs::path dir = fresh_run_dir(name, "pretrain.jsonl", 240, 20);
  std::ofstream(dir / "config.yaml") << "model: " << kFixtures << "/llama_gqa\n"
                                     << "tokenizer: " << kFixtures << "/tokenizer/tokenizer.model\n"
                                     << "data: {train: train.jsonl, eval: eval.jsonl, packing: true}\n"
                                     << "seq_len: 64\nmicro_batch_size: 16\ngrad_accum_steps: 4\n"
                                     << "lora: {r: 4, lora_alpha: 8, lora_dropout: 0.1}\n"
                                     << "lr: 1.0e-3\nmax_steps: 20\nsave_every: 10\neval_batches: 1\n"
                                     << "generate: {max_new_tokens: 4, num_samples: 1}\noutput_dir: out\n"
                                     << extra_yaml;
  return dir.string();
}

// step -> key (loss, grad_norm) of the training rows of a metrics.jsonl.
std::map<int64_t, double> step_metric(const std::string& metrics_path, const std::string& key) {
  std::map<int64_t, double> values;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    auto row = nlohmann::json::parse(line, nullptr, false);  // a row being written is skipped
    if (row.is_object() && row.contains(key)) values[row["step"].get<int64_t>()] = row[key].get<double>();
  }
  return values;
}

std::map<int64_t, double> train_losses(const std::string& metrics_path) { return step_metric(metrics_path, "loss"); }

int64_t last_logged_step(const std::string& metrics_path) {
  const auto losses = train_losses(metrics_path);
  return losses.empty() ? 0 : losses.rbegin()->first;
}

// Starts program in dir with args, its stdout and stderr going to
// output_path, and returns its pid. alarm is kept across exec: a hung run
// dies of SIGALRM.
pid_t start_program(const std::string& program, const std::string& dir, const std::vector<std::string>& args,
                    const std::string& output_path) {
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (chdir(dir.c_str()) != 0 || !freopen(output_path.c_str(), "w", stdout) || dup2(1, 2) < 0) _exit(126);
    alarm(kRunTimeoutS);
    std::vector<char*> argv = {const_cast<char*>(program.c_str())};
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  return child;
}

pid_t start_finetune(const std::string& dir, const std::vector<std::string>& args, const std::string& output_path) {
  return start_program(kBinary, dir, args, output_path);
}

// Waits until ready() (failing if child ends first, saying what it waited
// for), sends signal and returns child's wait status.
int signal_when(pid_t child, const std::function<bool()>& ready, int signal, const std::string& waited_for) {
  while (!ready()) {
    int early_status = 0;
    REQUIRE_MESSAGE(waitpid(child, &early_status, WNOHANG) == 0, "finetune ended before ", waited_for);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  kill(child, signal);
  int status = 0;
  waitpid(child, &status, 0);
  return status;
}

// The run of `args` in dir killed (SIGKILL) once its first checkpoint is
// saved, then `finetune<command> --resume` there (command: " config.yaml
// ..."): the resumed run's training losses by step.
std::map<int64_t, double> killed_and_resumed(const std::string& dir, const std::vector<std::string>& args,
                                             const std::string& command) {
  pid_t child = start_finetune(dir, args, "/dev/null");
  const std::string state = dir + "/out/train_state.safetensors";
  CHECK(WIFSIGNALED(signal_when(child, [&] { return fs::exists(state); }, SIGKILL, "saving step 10")));
  const CommandResult resumed = run_command("cd " + dir + " && " + kBinary + command + " --resume");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  return train_losses(dir + "/out/metrics.jsonl");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("finetune prints PEFT's trainable-parameter line and writes adapter and metrics") {
  const std::string dir = make_run_dir("basic");
  CommandResult result = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=2");
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  // Adapters: 2 layers x (q_proj 4 x (64 + 64) + v_proj 4 x (64 + 32)) = 1,792. Base: embed and lm_head
  // 2 x 320 x 64, per layer q/o 2 x 64 x 64, k/v 2 x 32 x 64, MLP 3 x 88 x 64, norms 2 x 64 (x 2 layers),
  // final norm 64: 99,648. PEFT counts the adapters in "all params".
  CHECK(result.output.find("trainable params: 1,792 || all params: 101,440 || trainable%: 1.7666") !=
        std::string::npos);
  CHECK(fs::exists(dir + "/out/adapter/adapter_model.safetensors"));
  CHECK(fs::exists(dir + "/out/adapter/adapter_config.json"));
  CHECK(train_losses(dir + "/out/metrics.jsonl").size() == 2);
  // The fixture's config.json and SentencePiece tokenizer agree on </s>.
  CHECK(result.output.find("special tokens: examples end with 2 \"</s>\"; generation stops at [2 \"</s>\"]") !=
        std::string::npos);
  // A row whose prompt alone fills seq_len trains nothing: counted as dropped, beside the truncated ones.
  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "hello ";
  std::ofstream(dir + "/long.jsonl") << "{\"prompt\": \"" << long_prompt << "\", \"completion\": \"world\"}\n"
                                     << "{\"prompt\": \"hi\", \"completion\": \"there\"}\n";
  const CommandResult dropped = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=1 " +
                                            "--set data.train=long.jsonl --set data.eval=long.jsonl " +
                                            "--set generate.num_samples=0 --set output_dir=out_long");
  INFO(dropped.output);
  REQUIRE(dropped.exit_code == 0);
  CHECK(dropped.output.find("1 truncated to seq_len 64, 1 dropped (no completion token "
                            "within seq_len)") != std::string::npos);
}

TEST_CASE("a run killed with SIGKILL after a checkpoint resumes to identical losses") {
  const std::string full_dir = make_run_dir("full");
  REQUIRE(run_command("cd " + full_dir + " && " + kBinary + " config.yaml").exit_code == 0);
  const auto full = train_losses(full_dir + "/out/metrics.jsonl");
  REQUIRE(full.size() == 20);

  const std::string dir = make_run_dir("killed");
  pid_t child = start_finetune(dir, {"config.yaml"}, "/dev/null");
  // The state file appears when step 10 is saved; kill at once, mid-run.
  const std::string state = dir + "/out/train_state.safetensors";
  const int status = signal_when(child, [&] { return fs::exists(state); }, SIGKILL, "saving step 10");
  CHECK(WIFSIGNALED(status));
  const auto before_resume = train_losses(dir + "/out/metrics.jsonl");
  CHECK(before_resume.size() < 20);  // the kill landed before the end

  CommandResult resumed = run_command("cd " + dir + " && " + kBinary + " config.yaml --resume");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("resumed at step 10") != std::string::npos);
  const auto after = train_losses(dir + "/out/metrics.jsonl");
  REQUIRE(after.size() == 20);
  // No structured binding: clang cannot capture one in CAPTURE's lambda under OpenMP.
  for (const auto& step_loss : full) {
    CAPTURE(step_loss.first);
    CHECK(after.at(step_loss.first) == step_loss.second);  // bit-identical, not approximately equal
  }
}

// NEFTune (unpacked rows: padding_free is refused with it): the noise moves
// every training loss but not the evaluation before training, and it is
// drawn from the micro-batches' seeds (as dropout's masks), so a run killed
// with SIGKILL resumes to the uninterrupted run's losses.
TEST_CASE("neftune_noise_alpha: training losses move, step 0's eval loss does not, and a killed run resumes") {
  const std::vector<std::string> args = {"config.yaml", "--set", "data.packing=false"};
  const std::string unpacked = " config.yaml --set data.packing=false";
  const std::string noise = "neftune_noise_alpha: 5\n";
  const std::string plain_dir = make_run_dir("neftune_off"), noisy_dir = make_run_dir("neftune_on", noise);
  REQUIRE(run_command("cd " + plain_dir + " && " + kBinary + unpacked).exit_code == 0);
  REQUIRE(run_command("cd " + noisy_dir + " && " + kBinary + unpacked).exit_code == 0);
  const auto plain = train_losses(plain_dir + "/out/metrics.jsonl");
  const auto noisy = train_losses(noisy_dir + "/out/metrics.jsonl");
  REQUIRE(plain.size() == 20);
  REQUIRE(noisy.size() == 20);
  CHECK(noisy.at(1) != plain.at(1));
  CHECK(step_metric(noisy_dir + "/out/metrics.jsonl", "eval_loss").at(0) ==
        step_metric(plain_dir + "/out/metrics.jsonl", "eval_loss").at(0));

  const auto after = killed_and_resumed(make_run_dir("neftune_killed", noise), args, unpacked);
  REQUIRE(after.size() == 20);
  for (const auto& step_loss : noisy) {
    CAPTURE(step_loss.first);
    CHECK(after.at(step_loss.first) == step_loss.second);
  }
}

// DoRA over the default INT8 base with LoRA dropout 0.1: the run trains
// (its loss falls), saves PEFT's magnitude tensors, a killed run resumes to
// the same losses, and the merged folder generates what the adapter over the
// unquantised base does.
TEST_CASE("lora.use_dora: a DoRA run trains, resumes after kill -9 to the same losses, and merges") {
  const std::vector<std::string> args = {"config.yaml", "--set", "lora.use_dora=true"};
  const std::string dora = " config.yaml --set lora.use_dora=true";
  const std::string full_dir = make_run_dir("dora_full");
  const CommandResult full = run_command("cd " + full_dir + " && " + kBinary + dora);
  INFO(full.output);
  REQUIRE(full.exit_code == 0);
  const auto losses = train_losses(full_dir + "/out/metrics.jsonl");
  REQUIRE(losses.size() == 20);
  CHECK(losses.at(20) < losses.at(1));
  const SafetensorsFile adapter(full_dir + "/out/adapter/adapter_model.safetensors");
  int64_t magnitudes = 0;
  for (const SafetensorsEntry& entry : adapter.entries()) magnitudes += entry.name.ends_with(kDoraMagnitudeSuffix);
  CHECK(magnitudes == 4);  // q_proj and v_proj of 2 layers
  CHECK(read_file(full_dir + "/out/adapter/adapter_config.json").find("\"use_dora\": true") != std::string::npos);

  const auto after = killed_and_resumed(make_run_dir("dora_killed"), args, dora);
  for (const auto& [step, loss] : losses) {
    CAPTURE(step);
    CHECK(after.at(step) == loss);
  }

  const std::string model = kFixtures + "/llama_gqa", tokenizer = kFixtures + "/tokenizer/tokenizer.model";
  REQUIRE(run_command(kBinary + " merge " + model + " --adapter " + full_dir + "/out/adapter --out " + full_dir +
                      "/merged").exit_code == 0);
  const std::string prompt = " --tokenizer " + tokenizer + " --device cpu --prompt 'The cat' --max-new-tokens 12 "
                             "--ignore-eos 2>/dev/null";
  const CommandResult over_base = run_command(kBinary + " generate " + model + " --adapter " + full_dir +
                                              "/out/adapter --quantization none" + prompt);
  REQUIRE(over_base.exit_code == 0);
  CHECK(run_command(kBinary + " generate " + full_dir + "/merged" + prompt).output == over_base.output);
}

// PEFT's module selection from the run config: a pattern target, layers and
// an exclusion reach the saved adapter, and a mistyped rank_pattern key is
// warned about (it changes nothing, as in PEFT).
TEST_CASE("lora.target_modules as a pattern with exclude_modules trains those modules and warns of an unused key") {
  const std::string dir = make_run_dir("module_selection",
                                       "lora.target_modules: 'model\\.layers\\.1\\..*_proj'\n"
                                       "lora.exclude_modules: [mlp.up_proj]\nlora.rank_pattern: {q_projj: 8}\n");
  const CommandResult run = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=2");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("warning: lora.rank_pattern \"q_projj\" matches no adapted module: it changes nothing") !=
        std::string::npos);
  const SafetensorsFile adapter(dir + "/out/adapter/adapter_model.safetensors");
  CHECK(adapter.entries().size() == 12);  // layer 1's six linears but up_proj, A and B each
  for (const SafetensorsEntry& entry : adapter.entries()) {
    CAPTURE(entry.name);
    CHECK(entry.name.find(".layers.1.") != std::string::npos);
    CHECK(entry.name.find("up_proj") == std::string::npos);
  }
  const std::string saved = read_file(dir + "/out/adapter/adapter_config.json");
  CHECK(saved.find("\"target_modules\": \"model\\\\.layers\\\\.1\\\\..*_proj\"") != std::string::npos);
  CHECK(saved.find("\"exclude_modules\": [\n    \"mlp.up_proj\"\n  ]") != std::string::npos);
}

// mlp_chunk_tokens 100 (the 16 x 64-token micro-batch's last chunk has 24)
// under per-layer checkpointing, over the unquantised base with LoRA on q and v
// (dropout 0.1): the MLP trains nothing, so the losses are the unchunked
// run's bit for bit, and a chunked run stopped after 10 steps resumes to the
// same 20 (a constant rate, so max_steps does not change it). Not over the
// default INT8 base: LLM.int8() finds its outlier columns over the rows of
// each call, so a chunk may route other columns through the 16-bit part.
// (offload.activations is a GPU run's: tests/emu/test_cuda_training.cpp runs
// it with the MLP chunked.)
TEST_CASE("mlp_chunk_tokens: a chunked run trains, equals the unchunked run, and resumes") {
  const std::string base = "activation_checkpointing: per_layer\nquantization: {mode: none}\nschedule: constant\n";
  const std::string plain_dir = make_run_dir("mlp_unchunked", base);
  REQUIRE(run_command("cd " + plain_dir + " && " + kBinary + " config.yaml").exit_code == 0);
  const auto plain = train_losses(plain_dir + "/out/metrics.jsonl");
  REQUIRE(plain.size() == 20);

  const std::string dir = make_run_dir("mlp_chunked", base + "mlp_chunk_tokens: 100\n");
  REQUIRE(run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=10").exit_code == 0);
  CommandResult resumed = run_command("cd " + dir + " && " + kBinary + " config.yaml --resume");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("resumed at step 10") != std::string::npos);
  const auto chunked = train_losses(dir + "/out/metrics.jsonl");
  REQUIRE(chunked.size() == 20);
  for (const auto& step_loss : plain) {
    CAPTURE(step_loss.first);
    CHECK(chunked.at(step_loss.first) == step_loss.second);
  }
}

TEST_CASE("SIGTERM saves a checkpoint at the next step boundary, exits 143, and --resume finishes the run") {
  const std::string full_dir = make_run_dir("unstopped");
  REQUIRE(run_command("cd " + full_dir + " && " + kBinary + " config.yaml").exit_code == 0);
  const auto full = train_losses(full_dir + "/out/metrics.jsonl");
  REQUIRE(full.size() == 20);

  const std::string dir = make_run_dir("stopped");
  pid_t child = start_finetune(dir, {"config.yaml"}, dir + "/stdout.txt");
  // The first checkpoint is due at step 10; signal as soon as step 2 is logged.
  const int status = signal_when(
      child, [&] { return train_losses(dir + "/out/metrics.jsonl").size() >= 2; }, SIGTERM, "step 2");
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 143);
  const std::string output = read_file(dir + "/stdout.txt");
  INFO(output);
  const size_t stopped_at = train_losses(dir + "/out/metrics.jsonl").size();
  CHECK(stopped_at < 20);
  CHECK(output.find("SIGTERM: stopped after step " + std::to_string(stopped_at) +
                    "; checkpoint saved to out/train_state.safetensors; continue with --resume") != std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/out/adapter"));

  CommandResult resumed = run_command("cd " + dir + " && " + kBinary + " config.yaml --resume");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("resumed at step " + std::to_string(stopped_at)) != std::string::npos);
  const auto after = train_losses(dir + "/out/metrics.jsonl");
  REQUIRE(after.size() == 20);
  for (const auto& step_loss : full) {
    CAPTURE(step_loss.first);
    CHECK(after.at(step_loss.first) == step_loss.second);  // bit-identical to the run that was never stopped
  }
}

TEST_CASE("a second SIGINT stops at once, saying what it loses") {
  // Steps of 256 micro-batches (about a second each here): the second signal lands mid-step.
  const std::string dir = make_run_dir("stopped_twice");
  pid_t child = start_finetune(dir, {"config.yaml", "--set", "grad_accum_steps=256"}, dir + "/stdout.txt");
  const auto said = [&](const std::string& text) { return read_file(dir + "/stdout.txt").find(text) != std::string::npos; };
  const auto step_logged = [&] { return !train_losses(dir + "/out/metrics.jsonl").empty(); };
  const std::string first = "SIGINT: stopping after this step, with a checkpoint (a second signal stops at once)";
  bool sent = false;  // the first SIGINT, once a step is logged
  const int status = signal_when(
      child,
      [&] {
        if (!sent && step_logged()) sent = kill(child, SIGINT) == 0;
        return sent && said(first);
      },
      SIGINT, "the first SIGINT's message");
  const std::string output = read_file(dir + "/stdout.txt");
  INFO(output);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGINT);
  CHECK(output.find("SIGINT: a second stop signal: stopped at once; the steps since the last checkpoint are lost") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/out/train_state.safetensors"));  // the first save is due at step 10
}

TEST_CASE("--resume past max_steps refuses and leaves the run as it was; at max_steps it rewrites the same adapter; "
          "a fresh run over it needs --overwrite") {
  const std::string dir = make_run_dir("finished");
  const std::string finetune = "cd " + dir + " && " + kBinary + " config.yaml";
  REQUIRE(run_command(finetune).exit_code == 0);
  const std::string state = read_file(dir + "/out/train_state.safetensors");
  const std::string metrics = read_file(dir + "/out/metrics.jsonl");
  const std::string adapter = read_file(dir + "/out/adapter/adapter_model.safetensors");

  CommandResult past = run_command(finetune + " --resume --set max_steps=5");
  INFO(past.output);
  CHECK(past.exit_code == 1);
  CHECK(past.output.find("out/train_state.safetensors: the training state is at step 20, past the 5 steps") !=
        std::string::npos);
  CHECK(read_file(dir + "/out/train_state.safetensors") == state);
  CHECK(read_file(dir + "/out/metrics.jsonl") == metrics);
  CHECK(read_file(dir + "/out/adapter/adapter_model.safetensors") == adapter);

  CommandResult complete = run_command(finetune + " --resume");
  INFO(complete.output);
  CHECK(complete.exit_code == 0);
  CHECK(complete.output.find("resumed at step 20") != std::string::npos);
  CHECK(read_file(dir + "/out/train_state.safetensors") == state);
  CHECK(read_file(dir + "/out/metrics.jsonl") == metrics);  // the final eval again, not twice
  CHECK(read_file(dir + "/out/adapter/adapter_model.safetensors") == adapter);

  // A fresh run into the same folder would replace it all: refused, nothing touched, unless --overwrite.
  CommandResult again = run_command(finetune + " --set max_steps=1");
  CHECK(again.exit_code == 1);
  CHECK(again.output.find("error: out/train_state.safetensors: output_dir holds an earlier run's checkpoint (its "
                          "adapter and metrics beside it): continue that run with --resume, start afresh over it "
                          "with --overwrite, or set another output_dir") != std::string::npos);
  CHECK(read_file(dir + "/out/train_state.safetensors") == state);
  CHECK(read_file(dir + "/out/adapter/adapter_model.safetensors") == adapter);
  CHECK(run_command(finetune + " --resume --overwrite").output.find("--resume continues a run; --overwrite starts "
                                                                    "one afresh: give one") != std::string::npos);
  // An earlier full fine-tune's model/ beside this run's adapter would not be this run's.
  fs::create_directories(dir + "/out/model");
  std::ofstream(dir + "/out/model/model.safetensors") << "an earlier run's";
  CHECK(run_command(finetune + " --set max_steps=1 --overwrite").exit_code == 0);
  CHECK(read_file(dir + "/out/adapter/adapter_model.safetensors") != adapter);
  CHECK(!fs::exists(dir + "/out/model"));

  // A run over it stopped before its first checkpoint leaves no earlier state for --resume to continue.
  fs::remove(dir + "/out/metrics.jsonl");  // so that a logged step is the new run's
  REQUIRE(fs::exists(dir + "/out/train_state.safetensors"));
  const pid_t stopped = start_finetune(dir, {"config.yaml", "--set", "max_steps=1000", "--set", "save_every=0",
                                             "--overwrite"}, dir + "/stopped.txt");
  int status = 0;
  while (waitpid(stopped, &status, WNOHANG) == 0 && last_logged_step(dir + "/out/metrics.jsonl") < 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  kill(stopped, SIGKILL);
  waitpid(stopped, &status, 0);
  REQUIRE_MESSAGE(WIFSIGNALED(status), read_file(dir + "/stopped.txt"));
  CHECK(!fs::exists(dir + "/out/train_state.safetensors"));
  CHECK(!fs::exists(dir + "/out/adapter"));
  CHECK(run_command(finetune + " --resume").output.find("no training state to resume from") != std::string::npos);
  REQUIRE(run_command(finetune + " --set max_steps=1 --overwrite").exit_code == 0);
  // A base model kept in output_dir/model is the run's input, not an earlier run's output: it stays.
  fs::copy(kFixtures + "/llama_gqa", dir + "/out/model");
  CHECK(run_command(finetune + " --set max_steps=1 --set model=out/model --overwrite").exit_code == 0);
  CHECK(fs::exists(dir + "/out/model/model.safetensors"));

  // Without its training state, the adapter still belongs to an earlier run.
  fs::remove(dir + "/out/train_state.safetensors");
  const std::string kept = read_file(dir + "/out/adapter/adapter_model.safetensors");
  CommandResult stateless = run_command(finetune + " --set max_steps=1");
  CHECK(stateless.exit_code == 1);
  CHECK(stateless.output.find("error: config.yaml: output_dir out holds an earlier run's "
                              "adapter/adapter_model.safetensors (and no training state to resume from)") !=
        std::string::npos);
  CHECK(read_file(dir + "/out/adapter/adapter_model.safetensors") == kept);
}

TEST_CASE("device: auto says which backend it picked and why; device: cuda without a GPU is an error") {
  const std::string dir = make_run_dir("device");
  std::string no_cuda_why;
  const bool has_cuda = ft::cuda_device_count(&no_cuda_why) > 0;
  CommandResult automatic = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=1");
  INFO(automatic.output);
  REQUIRE(automatic.exit_code == 0);
  if (has_cuda) {
    CHECK(automatic.output.find("device: cuda (auto: ") != std::string::npos);
    return;
  }
  CHECK(automatic.output.find("device: cpu (auto: no CUDA device: " + no_cuda_why + ")\n") != std::string::npos);
  CommandResult forced = run_command("cd " + dir + " && " + kBinary + " config.yaml --set device=cuda");
  INFO(forced.output);
  CHECK(forced.exit_code == 1);
  CHECK(forced.output.find("error: config.yaml: device: cuda, but no CUDA device is usable (" + no_cuda_why) !=
        std::string::npos);
}

TEST_CASE("bad input exits non-zero with a message naming what is wrong (training, generate, merge, plan)") {
  const std::string dir = make_run_dir("bad");
  const std::string model = kFixtures + "/llama_gqa", tokenizer = " --tokenizer " + kFixtures + "/tokenizer/tokenizer.model";
  struct Case {
    std::string arguments, expected;
  };
  const Case cases[] = {
      {"config.yaml --set lora.rank=4", "unknown key \"lora.rank\"; did you mean \"lora.r\"?"},
      {"config.yaml --set lora.r=0", "lora.r"},
      // Sizes that once overflowed their products (2^62 x 8 bytes = a 0-byte allocation, then a segfault).
      {"config.yaml --set lora.r=4611686018427387904", "lora.r: expected an integer in [1, 65536]"},
      {"config.yaml --set micro_batch_size=4611686018427387904", "micro_batch_size: expected an integer in [1, 65536]"},
      {"config.yaml --set seq_len=4611686018427387904", "seq_len: expected an integer in [1, 1048576]"},
      {"config.yaml --set epochs=4611686018427387904 --set max_steps=0", "epochs: expected an integer in [0, 1000000]"},
      {"config.yaml --set grad_accum_steps=4611686018427387904", "grad_accum_steps: expected an integer in [1, 65536]"},
      {"config.yaml --set lr=.inf", "lr: expected a finite number, got \".inf\""},
      {"config.yaml --set lr=1e30", "lr: expected a number in (0, 10], got \"1e30\""},
      {"config.yaml --set model=no_such_folder", "no_such_folder/config.json"},
      {"config.yaml --set seq_len=65", "seq_len 65 is larger than the model's max_position_embeddings 64"},
      {"config.yaml --set lora.target_modules=[q_proj,qkv]", "config.yaml: lora.target_modules: \"qkv\" matches no module"},
      {"config.yaml --set lora.target_modules=[q_proj,lm_head]",
       "config.yaml: lora.target_modules: \"lm_head\" is the output head or an embedding: LoRA on it is not supported"},
      {"config.yaml --set data.train=empty.jsonl", "empty.jsonl"},
      {"config.yaml --set data.eval=evl.jsonl", "config.yaml: data.eval: evl.jsonl: no such file"},
      {"config.yaml --set tokenizer=tok.model", "config.yaml: tokenizer: tok.model: no such file"},
      {"config.yaml --set data.train=bad_eos_model", "config.yaml: data.train: bad_eos_model: is a folder; expected a "
                                                     "JSONL file"},
      {"config.yaml --set tokenizer=bad_eos_model", "config.yaml: tokenizer: bad_eos_model: is a folder; expected a "
                                                    "tokenizer.model or tokenizer.json file"},
      {"config.yaml --set model=bad_eos_model --set tokenizer=", "config.yaml: tokenizer: bad_eos_model/tokenizer.model: "
       "no such file (the model folder has no tokenizer.model, tokenizer.json or spiece.model: set tokenizer)"},
      {"config.yaml --set data.train=broken.jsonl", "broken.jsonl:2"},
      {"config.yaml --resume --set output_dir=nothing_here", "no training state to resume from"},
      {"config.yaml --set task_metric=rouge", "eval.jsonl: task_metric: rouge scores the completion generated for each "
                                              "row's prompt, and these are text rows (no prompt)"},
      // Qwen2's tokenizer adds no bos: an empty prompt leaves ROUGE's generation nothing to start from.
      {"config.yaml --set model=" + kFixtures + "/qwen2_tiny --set tokenizer= --set data.eval=empty_prompt.jsonl "
       "--set task_metric=rouge",
       "empty_prompt.jsonl:2: the prompt has no token (it is empty, or no message comes before the reply, and no bos "
       "token is added), and task_metric: rouge generates"},
      {"config.yaml --set objective=reward --set data.train=margin.jsonl --set data.eval= --set data.packing=false --set seq_len=32",
       "margin.jsonl:2: no \"margin\", which line 1 gives: trl's RewardTrainer needs the column on every row or "
       "on none"},
      // Chat rows for a T5: that, not the missing chat template a T5 would not use.
      {"config.yaml --set model=" + std::string(FT_SOURCE_DIR) + "/configs/tiny-t5 --set tokenizer=" +
           std::string(FT_SOURCE_DIR) + "/configs/tiny-base/tokenizer.model --set data.train=chat.jsonl --set "
           "data.eval= --set seq_len=32 --set data.packing=false",
       "config.yaml: data.train (chat.jsonl) holds chat rows, which train decoder-only models; an encoder-decoder "
       "model needs prompt/completion rows"},
      {"missing.yaml", "missing.yaml"},
      {"train.jsonl", "train.jsonl: a JSONL data file where a YAML training config (CONFIG.yaml) was expected"},
      {"bad_lr.yaml", "bad_lr.yaml:3: lr: expected a finite number, got \".inf\""},
      {"config.yaml --set data.add_eos=320", "data.add_eos: token id 320 is outside the vocabulary [0, 320)"},
      {"config.yaml --set generate.stop=[2,-1]", "generate.stop: expected a token id in [0, 2147483647]"},
      {"config.yaml --set model=bad_eos_model",
       "bad_eos_model/config.json: \"eos_token_id\" holds id 999, outside the vocabulary [0, 320)"},
      {"generate --prompt hi", "generate: MODEL is required"},
      {"generate no_such_model --prompt hi", "no_such_model: MODEL must be a Hugging Face checkpoint folder"},
      {"generate " + model + tokenizer, "give exactly one of --prompt, --file and --interactive"},
      {"generate " + model + tokenizer + " --prompt hi --file rows.jsonl", "give exactly one of --prompt"},
      {"generate " + model + tokenizer + " --prompt '' --file rows.jsonl", "give exactly one of --prompt"},
      {"generate " + model + tokenizer + " --prompt hi --stop ''",
       "generate: --stop is empty; give the text (or special token) that ends a row"},
      {"generate " + kFixtures + "/qwen2_tiny --prompt ''",
       "generate: the prompt is empty and the tokenizer adds no BOS token: nothing to continue"},
      {"generate " + model + tokenizer + " --prompt hi --temperature warm",
       "--temperature: expected a number in [0, 100], got \"warm\""},
      {"generate " + model + tokenizer + " --prompt hi --top-k -1", "--top-k: expected an integer in [0, "},
      {"generate " + model + tokenizer + " --prompt hi --max-new-tokens", "--max-new-tokens: 1 required INT missing"},
      {"generate " + model + tokenizer + " --prompt hi --quantization int4",
       "--quantization: expected one of int8, nf4, none, got \"int4\""},
      {"generate " + model + tokenizer + " --file rows.jsonl", "rows.jsonl:2: expected a \"prompt\" string, got keys \"text\""},
      {"generate " + model + tokenizer + " --file none.jsonl", "none.jsonl: cannot open prompts file"},
      {"generate " + model + tokenizer + " --prompt hi --adapter " + model, "adapter_config.json"},
      {"generate " + model + " --prompt hi", model + ": the model folder has no tokenizer.model, tokenizer.json or "
                                             "spiece.model: give --tokenizer"},
      {"export " + model + " --gguf m.gguf", model + ": the model folder has no tokenizer.model, tokenizer.json or "
                                             "spiece.model: give --tokenizer"},
      {"merge " + model + " --adapter " + kFixtures + "/llama_lora/adapter", "merge: --out is required"},
      {"merge " + model + " --adapter " + kFixtures + "/llama_lora/adapter --out m --dtype f8",
       "--dtype: expected one of bf16, fp16, f16, f32, fp32, got \"f8\""},
      {"merge " + model + " --adapter " + kFixtures + "/gpt_neox_lora/adapter --out m", "has no weight"},
      // PEFT's older pickle format: named, with how to convert it, by both commands that read adapters.
      {"merge " + model + " --adapter bin_adapter --out m",
       "bin_adapter: holds adapter_model.bin (a PyTorch pickle) but no adapter_model.safetensors; only safetensors "
       "files are read"},
      {"generate " + model + tokenizer + " --prompt hi --adapter bin_adapter", "bin_adapter: holds adapter_model.bin"},
      // LoRA on an embedding: named in the adapter's file before its target_modules build the model.
      {"generate " + model + tokenizer + " --prompt hi --adapter embedding_adapter",
       "embedding_adapter/adapter_model.safetensors: tensor \"base_model.model.model.embed_tokens.lora_embedding_A\" is "
       "LoRA on an embedding, which is not supported"},
      {"merge " + model + " --adapter " + kFixtures + "/llama_lora/adapter --out m --max-shard-size lots",
       "--max-shard-size: \"lots\" is not a size"},
      // A folder where a file belongs: named, not read as an empty file.
      {"dir.yaml", "dir.yaml: is a directory, expected config file"},
      {"config.yaml --set model=dir_model", "dir_model/config.json: is a directory, expected model config"},
      {"generate " + model + " --tokenizer tokdir --prompt hi", "tokdir: is a directory, expected tokenizer file"},
      // A file where an output folder goes: named with the field, not the library's exception text.
      {"config.yaml --set output_dir=afile", "config.yaml: output_dir: cannot create the folder afile (Not a "
                                             "directory: a file is in the way)"},
      {"merge " + model + " --adapter " + kFixtures + "/llama_lora/adapter --out afile/m",
       "merge --out: cannot create the folder afile/m (Not a directory: a file is in the way)"},
      {"export " + model + tokenizer + " --gguf ''", "export: --gguf is empty; give the .gguf file to write"},
      {"plan config.yaml --gpu-mem inf", "--gpu-mem: \"inf\" is not a size below 1 EiB"},
      {"plan config.yaml --gpu-mem 1e30GiB", "\"1e30GiB\" is not a size below 1 EiB"},
      {"plan config.yaml --context-reserve 2EiB", "--context-reserve: \"2EiB\" is not a size"},
  };
  fs::create_directories(dir + "/bad_eos_model");
  nlohmann::json bad_eos = nlohmann::json::parse(std::ifstream(kFixtures + "/llama_gqa/config.json"));
  bad_eos["eos_token_id"] = {2, 999};
  std::ofstream(dir + "/bad_eos_model/config.json") << bad_eos.dump(2);
  std::ofstream(dir + "/bad_lr.yaml") << "model: m\ndata: {train: t.jsonl}\nlr: .inf\n";
  fs::create_directories(dir + "/dir.yaml");
  fs::create_directories(dir + "/dir_model/config.json");
  fs::create_directories(dir + "/tokdir");
  fs::create_directories(dir + "/bin_adapter");
  fs::copy_file(kFixtures + "/llama_lora/adapter/adapter_config.json", dir + "/bin_adapter/adapter_config.json",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir + "/bin_adapter/adapter_model.bin") << "PK";
  fs::create_directories(dir + "/embedding_adapter");
  std::ofstream(dir + "/embedding_adapter/adapter_config.json")
      << R"({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj", "embed_tokens"]})";
  {
    HostAllocator host;
    Tensor embedding_a = Tensor::empty({2, 320}, DType::f32, host, MemCategory::weights);
    std::fill_n(embedding_a.ptr<float>(), embedding_a.numel(), 0.0f);
    save_safetensors(dir + "/embedding_adapter/adapter_model.safetensors",
                     {{"base_model.model.model.embed_tokens.lora_embedding_A", embedding_a}});
  }
  std::ofstream(dir + "/empty.jsonl") << "\n";
  std::ofstream(dir + "/afile") << "not a folder\n";
  std::ofstream(dir + "/broken.jsonl") << "{\"text\": \"fine\"}\n{\"text\": oops}\n";
  std::ofstream(dir + "/rows.jsonl") << "{\"prompt\": \"fine\"}\n{\"text\": \"no prompt\"}\n";
  std::ofstream(dir + "/chat.jsonl") << "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, "
                                        "{\"role\": \"assistant\", \"content\": \"Yo\"}]}\n";
  std::ofstream(dir + "/margin.jsonl") << "{\"prompt\": \"Q\", \"chosen\": \"a\", \"rejected\": \"b\", \"margin\": 1.5}\n"
                                          "{\"prompt\": \"Q\", \"chosen\": \"c\", \"rejected\": \"d\"}\n";
  std::ofstream(dir + "/empty_prompt.jsonl") << "{\"prompt\": \"Q\", \"completion\": \"a\"}\n"
                                                "{\"prompt\": \"\", \"completion\": \"b\"}\n";
  for (const Case& c : cases) {
    CAPTURE(c.arguments);
    CommandResult result = run_command("cd " + dir + " && " + kBinary + " " + c.arguments);
    CHECK(result.exit_code == 1);
    CHECK(result.output.find("error: ") != std::string::npos);
    CHECK_MESSAGE(result.output.find(c.expected) != std::string::npos, result.output);
  }
  CHECK(!fs::exists(dir + "/m"));  // a refused merge writes nothing
}

TEST_CASE("--help prints the usage with every option and exits 0, at the top level and for every subcommand") {
  struct Case {
    std::string subcommand;
    std::vector<std::string> options;
  };
  const Case cases[] = {
      {"", {"CONFIG", "--set", "--resume", "--allow-data-change", "--version", "plan", "generate", "merge", "course"}},
      {"plan", {"CONFIG", "--gpu-mem", "--device", "--context-reserve", "--ranks", "--h2d-bandwidth", "--tflops", "--set"}},
      {"generate", {"MODEL", "--adapter", "--tokenizer", "--prompt", "--file", "--interactive", "--max-new-tokens",
                    "--temperature", "--top-p", "--top-k", "--repetition-penalty", "--stop", "--seed", "--batch-size",
                    "--no-kv-cache", "--ignore-eos", "--quantization", "--precision", "--device"}},
      {"merge", {"MODEL", "--adapter", "--out", "--dtype", "--max-shard-size"}},
      {"course", {"CONFIGS_DIR"}},
  };
  for (const Case& c : cases) {
    for (const char* help : {" --help", " -h"}) {
      const std::string arguments = (c.subcommand.empty() ? "" : " " + c.subcommand) + help;
      CAPTURE(arguments);
      const CommandResult result = run_command(kBinary + arguments);
      CHECK(result.exit_code == 0);
      const std::string usage = "Usage: finetune" + (c.subcommand.empty() ? "" : " " + c.subcommand) + " [OPTIONS]";
      CHECK_MESSAGE(result.output.find(usage) != std::string::npos, result.output);
      for (const std::string& option : c.options) CHECK_MESSAGE(result.output.find(option) != std::string::npos, option);
    }
  }
}

TEST_CASE("--version prints the version and which backends this build has, and exits 0") {
  const CommandResult result = run_command(kBinary + " --version");
  CHECK(result.exit_code == 0);
  CHECK_MESSAGE(result.output.starts_with("finetune "), result.output);
  for (const char* backend : {"\nCUDA: ", "\ncuDNN SDPA: ", "\nCUTLASS int8 GEMM (sm_90): ", "\noneDNN: ", "\nMPI: ", "\nNCCL: "})
    CHECK_MESSAGE(result.output.find(backend) != std::string::npos, backend);
  // The MPI line says what the build found: the data-parallel tests run mpirun where it did.
  CHECK(result.output.find(std::string(FT_MPIRUN).empty() ? "MPI: OFF" : "MPI: ON") != std::string::npos);
}

TEST_CASE("an unknown option or a bad value is one error line naming the option, exit 1") {
  const std::string dir = make_run_dir("bad_options");
  const std::string model = kFixtures + "/llama_gqa", adapter = kFixtures + "/llama_lora/adapter";
  struct Case {
    std::string arguments, expected;
  };
  const Case cases[] = {
      {"config.yaml --bogus", "--bogus"},
      {"plan config.yaml --bogus", "--bogus"},
      {"generate " + model + " --prompt hi --bogus", "--bogus"},
      {"merge " + model + " --adapter " + adapter + " --out m --bogus", "--bogus"},
      {"course --bogus", "--bogus"},
      // An unknown option is named even where a required argument is missing too.
      {"plan --bogus", "plan: The following argument was not expected: --bogus"},
      {"merge " + model + " --bogus", "merge: The following argument was not expected: --bogus"},
      {"config.yaml --set", "--set"},
      {"plan config.yaml --ranks two", "--ranks: expected an integer in [1, 1048576], got \"two\""},
      {"plan config.yaml --device gpu", "--device: expected one of cuda, cpu, got \"gpu\""},
      {"plan config.yaml --h2d-bandwidth 0", "--h2d-bandwidth: expected > 0 bytes per second, got \"0\""},
      {"generate " + model + " --prompt hi --seed -1", "--seed: expected an integer in [0, "},
      {"generate " + model + " --prompt hi --device gpu", "--device: expected one of auto, cpu, cuda, got \"gpu\""},
      {"generate " + model + " --prompt hi --precision fp16", "--precision: expected one of fp32, bf16, got \"fp16\""},
      {"merge " + model + " --adapter " + adapter + " --out m --max-shard-size 0", "--max-shard-size: expected a size > 0"},
      {"config.yaml plan config.yaml", "CONFIG belongs to a training run, not to plan"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.arguments);
    const CommandResult result = run_command("cd " + dir + " && " + kBinary + " " + c.arguments);
    CHECK(result.exit_code == 1);
    CHECK_MESSAGE(result.output.starts_with("error: "), result.output);
    CHECK_MESSAGE(std::count(result.output.begin(), result.output.end(), '\n') == 1, result.output);
    CHECK_MESSAGE(result.output.find(c.expected) != std::string::npos, result.output);
  }
  CHECK(!fs::exists(dir + "/m"));
}

namespace {

// The JSON header of a safetensors file as any reader sees it, and its size
// (the data starts 8 + header_bytes into the file).
nlohmann::json safetensors_header(std::istream& file, uint64_t& header_bytes) {
  file.read(reinterpret_cast<char*>(&header_bytes), 8);  // little-endian, as x86 and the format
  std::string header(header_bytes, '\0');
  file.read(header.data(), std::streamsize(header_bytes));
  REQUIRE(file.good());
  return nlohmann::json::parse(header);
}

// Overwrites every f32 value of one tensor of a safetensors file in place.
void overwrite_f32_tensor(const std::string& path, const std::string& name, float value) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_bytes = 0;
  const auto entry = safetensors_header(file, header_bytes).at(name);
  REQUIRE(entry.at("dtype") == "F32");
  const int64_t begin = entry.at("data_offsets")[0], end = entry.at("data_offsets")[1];
  file.seekp(std::streamoff(8 + header_bytes + uint64_t(begin)));
  for (int64_t i = begin; i < end; i += 4) file.write(reinterpret_cast<const char*>(&value), 4);
  REQUIRE(file.good());
}

// Whether every value of every F32 tensor of a safetensors file is finite.
bool all_f32_finite(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  uint64_t header_bytes = 0;
  const nlohmann::json entries = safetensors_header(file, header_bytes);
  const std::string data((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  for (const auto& [name, entry] : entries.items()) {
    if (name == "__metadata__" || entry.at("dtype") != "F32") continue;
    const size_t begin = entry.at("data_offsets")[0], end = entry.at("data_offsets")[1];
    for (size_t offset = begin; offset < end; offset += 4) {
      float value;
      std::memcpy(&value, data.data() + offset, 4);
      if (!std::isfinite(value)) return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("a diverging run skips its bad steps, stops after max_bad_steps with exit 1 and writes no NaN") {
  // A final norm weight of 3e38 (finite, as a checkpoint may hold it) sends the logits to +-Inf and the
  // loss to NaN from the first step: the run diverges whatever the learning rate.
  const std::string dir = make_run_dir("diverging");
  fs::create_directories(dir + "/model");
  for (const char* file : {"config.json", "model.safetensors"})
    fs::copy_file(kFixtures + "/llama_gqa/" + file, dir + "/model/" + file);
  const std::string healthy = run_command("cd " + dir + " && " + kBinary + " config.yaml --set model=model --set max_steps=1").output;
  REQUIRE_MESSAGE(healthy.find("adapter (PEFT format)") != std::string::npos, healthy);  // the copy trains before the edit
  fs::remove_all(dir + "/out");
  overwrite_f32_tensor(dir + "/model/model.safetensors", "model.norm.weight", 3e38f);

  CommandResult result = run_command("cd " + dir + " && " + kBinary + " config.yaml --set model=model --set save_every=1 --set max_steps=6");
  INFO(result.output);
  CHECK(result.exit_code == 1);
  for (int step = 1; step <= 3; ++step)
    CHECK(result.output.find("step " + std::to_string(step) + ": loss -nan, gradient norm nan: not finite, optimizer "
                             "step skipped (the first is the gradient of model.layers.0.self_attn.q_proj.lora_A.weight); " +
                             std::to_string(step) + " of max_bad_steps 3 in a row") != std::string::npos);
  CHECK(result.output.find("error: training diverged: 3 steps in a row with a non-finite loss or gradient norm "
                           "(max_bad_steps: 3, config.yaml)") != std::string::npos);
  CHECK(result.output.find("step 4/6") == std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/out/adapter"));
  // The states saved at the skipped steps hold the last good (initial) adapters, never a NaN.
  REQUIRE(fs::exists(dir + "/out/train_state.safetensors"));
  CHECK(all_f32_finite(dir + "/out/train_state.safetensors"));

  // max_bad_steps is the config's: 1 stops at the first bad step.
  fs::remove_all(dir + "/out");
  CommandResult strict = run_command("cd " + dir + " && " + kBinary + " config.yaml --set model=model --set max_bad_steps=1");
  CHECK(strict.exit_code == 1);
  CHECK(strict.output.find("error: training diverged: 1 steps in a row") != std::string::npos);
}

TEST_CASE("a failed metrics write warns once, keeps the rows for a retry, and the run goes on") {
  const std::string dir = make_run_dir("metrics_full");
  fs::create_directories(dir + "/out");
  fs::create_symlink("/dev/full", dir + "/out/metrics.jsonl");  // every write fails with ENOSPC
  CommandResult result = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=3");
  INFO(result.output);
  CHECK(result.exit_code == 0);
  const std::string warning = "warning: out/metrics.jsonl: cannot write a metrics row (No space left on device)";
  const size_t first = result.output.find(warning);
  CHECK(first != std::string::npos);
  CHECK(result.output.find(warning, first + 1) == std::string::npos);  // once, not once per row
  // 3 steps and the evaluations before and after: every row is counted as unwritten, none dropped silently.
  CHECK(result.output.find("warning: out/metrics.jsonl: 5 metrics rows could not be written") != std::string::npos);
  CHECK(fs::exists(dir + "/out/adapter/adapter_model.safetensors"));
}

TEST_CASE("a saved INT8 base has transformers' layout, loads directly and trains to the same losses") {
  const std::string dir = make_run_dir("save_base");
  CommandResult first = run_command("cd " + dir + " && " + kBinary +
                                    " config.yaml --set max_steps=3 --set quantization.save_base=base");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  REQUIRE(fs::exists(dir + "/base/model.safetensors"));
  // Saved as transformers + bitsandbytes save an 8-bit model (every key and tensor: test_bnb_checkpoint).
  const nlohmann::json saved_config = nlohmann::json::parse(std::ifstream(dir + "/base/config.json"));
  CHECK(saved_config["quantization_config"]["load_in_8bit"] == true);
  CHECK(Checkpoint(dir + "/base").contains("model.layers.0.self_attn.q_proj.SCB"));
  CommandResult second = run_command("cd " + dir + " && " + kBinary +
                                     " config.yaml --set max_steps=3 --set model=base --set output_dir=out2");
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK(train_losses(dir + "/out/metrics.jsonl") == train_losses(dir + "/out2/metrics.jsonl"));

  // A saved base is not written over by a later run without --overwrite, nor the model's own folder ever.
  const std::string saved = read_file(dir + "/base/model.safetensors");
  CommandResult again = run_command("cd " + dir + " && " + kBinary +
                                    " config.yaml --set max_steps=1 --set quantization.save_base=base --set output_dir=out3");
  CHECK(again.exit_code == 1);
  CHECK(again.output.find("error: config.yaml: quantization.save_base base already holds a model (config.json): give "
                          "a new folder, or --overwrite to replace it") != std::string::npos);
  CommandResult itself = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=1 --set model=base "
                                     "--set quantization.save_base=base --set output_dir=out4 --overwrite");
  CHECK(itself.exit_code == 1);
  CHECK(itself.output.find("quantization.save_base base is the model's own folder") != std::string::npos);
  CHECK(read_file(dir + "/base/model.safetensors") == saved);
}

TEST_CASE("GPT-NeoX trains with a tokenizer.json (byte-level BPE); one larger than the embedding is refused") {
  // The NeoX fixture's architecture with an embedding large enough for the
  // BPE fixture (519 ids), randomly initialised: tokenizer and model agree.
  const fs::path model_dir = fs::path(FT_BINARY_DIR) / "cli_runs" / "neox_bpe_model";
  fs::create_directories(model_dir);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(kFixtures + "/gpt_neox_parallel/config.json"));
  config["vocab_size"] = 520;
  std::ofstream(model_dir / "config.json") << config.dump(2);
  const std::string bpe = kFixtures + "/bpe_tokenizer/tokenizer.json";
  const std::string dir = make_run_dir("neox_bpe");
  const std::string neox = " --set lora.target_modules=[query_key_value] --set tokenizer=" + bpe;
  CommandResult result = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=2 --set init=random" +
                                     " --set model=" + model_dir.string() + neox);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  CHECK(train_losses(dir + "/out/metrics.jsonl").size() == 2);
  CHECK(fs::exists(dir + "/out/adapter/adapter_model.safetensors"));
  // A random base is not saved beside the adapter: no command can give its samples again.
  CHECK(result.output.find("the samples' prompts: out/sample_prompts.jsonl (init: random: the base's random weights "
                           "are not saved, so no command gives these samples again)") != std::string::npos);

  // The fixture NeoX embeds 320 ids: the BPE tokenizer's 519 do not fit.
  CommandResult refused = run_command("cd " + dir + " && " + kBinary + " config.yaml --set model=" + kFixtures +
                                      "/gpt_neox_parallel" + neox);
  INFO(refused.output);
  CHECK(refused.exit_code == 1);
  CHECK(refused.output.find("tokenizer.json") != std::string::npos);
  CHECK(refused.output.find("320") != std::string::npos);
}

TEST_CASE("--resume refuses a checkpoint of another base model or adapter config; --allow-data-change accepts new data only") {
  const std::string dir = make_run_dir("identity");
  fs::copy(kFixtures + "/llama_gqa", dir + "/base");
  const std::string base = " --set model=" + dir + "/base";
  const std::string finetune = "cd " + dir + " && " + kBinary + " config.yaml --set max_steps=2" + base;
  REQUIRE(run_command(finetune).exit_code == 0);

  const std::string config_json = read_file(dir + "/base/config.json");
  std::ofstream(dir + "/base/config.json", std::ios::app) << "\n";  // same model, different file: refused
  for (const char* flags : {" --resume", " --resume --allow-data-change"}) {
    CommandResult result = run_command(finetune + flags);
    INFO(result.output);
    CHECK(result.exit_code == 1);
    CHECK(result.output.find("out/train_state.safetensors: cannot resume: the checkpoint belongs to a different run:\n"
                             "  the base model's config.json (" + dir + "/base/config.json): now ") != std::string::npos);
    CHECK(result.output.find("--allow-data-change covers the data files only") != std::string::npos);
  }
  std::ofstream(dir + "/base/config.json", std::ios::trunc) << config_json;

  // The same names, dtypes and shapes with other values (the last f32 weight's
  // lowest mantissa bit flipped) is another base.
  const std::string weights = read_file(dir + "/base/model.safetensors");
  std::string changed = weights;
  changed[changed.size() - 4] = char(changed[changed.size() - 4] ^ 1);
  std::ofstream(dir + "/base/model.safetensors", std::ios::binary | std::ios::trunc) << changed;
  CommandResult other_weights = run_command(finetune + " --resume --allow-data-change");
  INFO(other_weights.output);
  CHECK(other_weights.exit_code == 1);
  CHECK(other_weights.output.find("  the base model's weights (xxHash of every tensor's bytes, " + dir +
                                  "/base): now xxh3 ") != std::string::npos);
  std::ofstream(dir + "/base/model.safetensors", std::ios::binary | std::ios::trunc) << weights;

  // How the base is held changes its values: NF4 is not the 16-bit base, nor NF4 without double quantisation.
  const std::string nf4 = finetune + " --set quantization.mode=nf4 --set output_dir=nf4";
  REQUIRE(run_command(nf4).exit_code == 0);
  for (const char* held : {"none", "nf4 --set quantization.double_quant=false"}) {
    CAPTURE(held);
    CommandResult other_held = run_command(finetune + " --set output_dir=nf4 --resume --set quantization.mode=" + held);
    INFO(other_held.output);
    CHECK(other_held.exit_code == 1);
    CHECK(other_held.output.find(", nf4, double_quant true\n") != std::string::npos);
  }

  CommandResult other_rank = run_command(finetune + " --resume --set lora.r=8");
  INFO(other_rank.output);
  CHECK(other_rank.exit_code == 1);
  CHECK(other_rank.output.find("  the adapter config: now {\"lora_alpha\":8.0,\"lora_dropout\":0.1,\"r\":8,") !=
        std::string::npos);

  // The saved position counts micro-batches of one order: another seed or
  // micro-batch size would skip rows or repeat them.
  CommandResult other_order = run_command(finetune + " --resume --set micro_batch_size=3 --set seed=7");
  INFO(other_order.output);
  CHECK(other_order.exit_code == 1);
  CHECK(other_order.output.find("  the data order (seed, micro_batch_size, data.packing: the saved position counts its "
                                "micro-batches): now seed 7, micro_batch_size 3, packing padding_free, seq_len 64; the "
                                "checkpoint's: seed 1234, micro_batch_size 16,") !=
        std::string::npos);
  CHECK(other_order.output.find("--resume --allow-data-change resumes with the changed data anyway") !=
        std::string::npos);

  std::ofstream(dir + "/train.jsonl", std::ios::app) << "{\"text\": \"one more example\"}\n";
  CommandResult new_data = run_command(finetune + " --resume");
  INFO(new_data.output);
  CHECK(new_data.exit_code == 1);
  CHECK(new_data.output.find("  the train data (") != std::string::npos);
  CHECK(new_data.output.find("--resume --allow-data-change resumes with the changed data anyway") != std::string::npos);
  CommandResult accepted = run_command(finetune + " --resume --allow-data-change");
  INFO(accepted.output);
  CHECK(accepted.exit_code == 0);
  CHECK(accepted.output.find("warning: resuming with changed data (--allow-data-change): the train data (") !=
        std::string::npos);
  CHECK(run_command(finetune + " --allow-data-change").output.find("--allow-data-change applies to --resume only") !=
        std::string::npos);
}

TEST_CASE("--resume refuses settings that change which rows the saved position counts; shorter changed data resumes "
          "at the next epoch") {
  const std::string dir = make_run_dir("kept_rows");
  // Prompt/completion rows with prompts of 1 to 48 words: seq_len decides which keep a completion token (the
  // others are dropped).
  std::ofstream train(dir + "/train.jsonl"), short_train(dir + "/short.jsonl");
  std::string prompt;
  for (int i = 0; i < 48; ++i) {
    prompt += "word ";
    const std::string row = "{\"prompt\": \"" + prompt + "\", \"completion\": \"done\"}\n";
    train << row;
    if (i < 4) short_train << row;
  }
  train.close();
  short_train.close();
  const std::string finetune = "cd " + dir + " && " + kBinary + " config.yaml --set data.packing=false --set "
                               "micro_batch_size=4 --set grad_accum_steps=1 --set data.eval= --set save_every=3";
  const CommandResult first = run_command(finetune + " --set max_steps=3 --set seq_len=64");
  REQUIRE_MESSAGE(first.exit_code == 0, first.output);
  const CommandResult shorter = run_command(finetune + " --set max_steps=6 --set seq_len=24 --resume");
  INFO(shorter.output);
  CHECK(shorter.exit_code == 1);
  CHECK(shorter.output.find("  the train rows kept (the data, seq_len and data settings decide which fit: the saved "
                            "position counts them): now ") != std::string::npos);
  // Changed data with fewer micro-batches than the saved position: the next epoch, said so.
  const CommandResult changed =
      run_command(finetune + " --set max_steps=6 --set seq_len=64 --set data.train=short.jsonl --resume "
                  "--allow-data-change");
  INFO(changed.output);
  CHECK(changed.exit_code == 0);
  CHECK(changed.output.find("warning: the changed train data ends before the saved position (epoch 0, 3 in): resuming "
                            "at the start of epoch 1") != std::string::npos);
}

TEST_CASE("an adapter on another local base than the one it names is warned about by generate and merge") {
  const std::string dir = make_run_dir("other_base");
  // The same shapes with another rope_theta: the adapter loads, and PEFT would say nothing.
  fs::copy(kFixtures + "/llama_gqa", dir + "/other");
  nlohmann::json other = nlohmann::json::parse(std::ifstream(dir + "/other/config.json"));
  other["rope_theta"] = 500000.0;
  std::ofstream(dir + "/other/config.json", std::ios::trunc) << other.dump(2);
  fs::copy(kFixtures + "/llama_lora/adapter", dir + "/adapter");
  nlohmann::json adapter = nlohmann::json::parse(std::ifstream(dir + "/adapter/adapter_config.json"));
  for (const std::string& base : {dir + "/other", kFixtures + "/llama_gqa"}) {
    CAPTURE(base);
    adapter["base_model_name_or_path"] = base;
    std::ofstream(dir + "/adapter/adapter_config.json", std::ios::trunc) << adapter.dump(2);
    const std::string warning = "warning: adapter: trained on " + dir + "/other (its base_model_name_or_path), "
                                "whose config.json differs from " + kFixtures + "/llama_gqa/config.json";
    const bool warned = base != kFixtures + "/llama_gqa";
    const CommandResult generated = run_command("cd " + dir + " && " + kBinary + " generate " + kFixtures +
                                                "/llama_gqa --adapter adapter --tokenizer " + kFixtures +
                                                "/tokenizer/tokenizer.model --prompt hi --max-new-tokens 2");
    INFO(generated.output);
    CHECK(generated.exit_code == 0);
    CHECK((generated.output.find(warning) != std::string::npos) == warned);
    const CommandResult merged = run_command("cd " + dir + " && " + kBinary + " merge " + kFixtures +
                                             "/llama_gqa --adapter adapter --out merged_" + (warned ? "other" : "own"));
    INFO(merged.output);
    CHECK(merged.exit_code == 0);
    CHECK((merged.output.find(warning) != std::string::npos) == warned);
  }
}

namespace {

int env_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  return text && *text ? std::atoi(text) : fallback;
}

// The temp files of every atomic save the run makes (atomic_file.h).
bool a_save_is_under_way(const std::string& out) {
  for (const char* name : {"train_state.safetensors.tmp", "adapter/adapter_model.safetensors.tmp",
                           "adapter/adapter_config.json.tmp", "metrics.jsonl.tmp"})
    if (fs::exists(out + "/" + name)) return true;
  return false;
}

// Blocks until a temp file of a save is created in out or out/adapter (true),
// or timeout_ms pass (false): inotify wakes this process at once, where
// polling under load would miss a save that lasts a fraction of a millisecond.
bool wait_for_a_save(const std::string& out, int timeout_ms) {
  const int fd = inotify_init1(IN_CLOEXEC);
  REQUIRE(fd >= 0);
  inotify_add_watch(fd, out.c_str(), IN_CREATE);
  inotify_add_watch(fd, (out + "/adapter").c_str(), IN_CREATE);  // absent until the end: fails, harmless
  bool seen = false;
  pollfd ready{fd, POLLIN, 0};
  alignas(inotify_event) char events[4096];
  while (!seen && ::poll(&ready, 1, timeout_ms) > 0) {
    const ssize_t got = ::read(fd, events, sizeof events);
    for (ssize_t at = 0; at < got;) {
      const auto* event = reinterpret_cast<const inotify_event*>(events + at);
      const std::string name = event->len ? event->name : "";
      seen = seen || (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0);
      at += ssize_t(sizeof(inotify_event) + event->len);
    }
  }
  ::close(fd);
  return seen;
}

}  // namespace

TEST_CASE("a step's evaluation comes before its checkpoint: a kill as the checkpoint lands loses no evaluation") {
  // transformers' Trainer evaluates, then saves. Saved first, a run killed between the two resumed after the
  // step and never evaluated it.
  const std::string dir = make_run_dir("eval_then_save"), out = dir + "/out";
  const std::vector<std::string> args = {"config.yaml", "--set", "max_steps=10", "--set", "save_every=5", "--set",
                                         "eval_every=5", "--set", "eval_batches=4"};
  const pid_t child = start_finetune(dir, args, dir + "/log.txt");
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0 && !fs::exists(out + "/train_state.safetensors"))
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  REQUIRE_MESSAGE(WIFSIGNALED(status), read_file(dir + "/log.txt"));  // killed with step 5's checkpoint saved
  CHECK(step_metric(out + "/metrics.jsonl", "eval_loss").contains(5));
  std::vector<std::string> resume = args;
  resume.push_back("--resume");
  const pid_t resumed = start_finetune(dir, resume, dir + "/resumed.txt");
  waitpid(resumed, &status, 0);
  REQUIRE_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), read_file(dir + "/resumed.txt"));
  std::vector<int64_t> evaluated;
  for (const auto& [step, loss] : step_metric(out + "/metrics.jsonl", "eval_loss")) evaluated.push_back(step);
  CHECK(evaluated == std::vector<int64_t>{0, 5, 10});
}

// A checkpoint every step; each kill lands at a seeded random moment of one of
// three kinds: a random delay after start (startup, resume, anything), a random
// delay after a chosen step is logged (the step's save follows at once), or
// the instant a save's temp file is seen (mid-save). FT_KILLS and FT_KILL_SEED
// change the count (default 20) and the seed. ctest runs it on its own, as
// test_finetune_cli_kill_20 (about 25 s of CPU), hence the skip here.
TEST_CASE("SIGKILL at 20 seeded random moments, saves included, still resumes to the bit-identical adapter" *
          doctest::skip()) {
  const int kills = env_int("FT_KILLS", 20);
  std::mt19937_64 random(uint64_t(env_int("FT_KILL_SEED", 20261124)));
  const std::vector<std::string> args = {"config.yaml", "--set", "save_every=1", "--set", "grad_accum_steps=1"};
  const int64_t steps = 20;

  const std::string full_dir = make_run_dir("kill_full");
  const auto start = std::chrono::steady_clock::now();
  pid_t full = start_finetune(full_dir, args, full_dir + "/log.txt");
  int status = 0;
  waitpid(full, &status, 0);
  const auto run_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
  REQUIRE_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), read_file(full_dir + "/log.txt"));

  const std::string dir = make_run_dir("kill_many"), out = dir + "/out";
  std::vector<int64_t> targets;
  for (int k = 0; k < kills; ++k) targets.push_back(std::uniform_int_distribution<int64_t>(1, steps)(random));
  std::sort(targets.begin(), targets.end());
  int mid_save = 0;
  for (int k = 0; k < kills; ++k) {
    std::vector<std::string> attempt = args;
    if (fs::exists(out + "/train_state.safetensors")) attempt.push_back("--resume");
    pid_t child = start_finetune(dir, attempt, dir + "/log.txt");
    const auto started = std::chrono::steady_clock::now();
    const int kind = k % 3;
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<int64_t>(
        0, kind == 0 ? int64_t(run_us.count()) : 2000)(random));
    auto still_running = [&] { return waitpid(child, &status, WNOHANG) == 0; };
    bool running = true;
    while (kind != 0 && (running = still_running()) && last_logged_step(out + "/metrics.jsonl") < targets[size_t(k)])
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    const auto armed = std::chrono::steady_clock::now();
    if (kind == 2 && running)
      wait_for_a_save(out, 2000);
    else
      while ((running = still_running()) && std::chrono::steady_clock::now() - (kind == 0 ? started : armed) < delay)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (running) {  // not yet reaped, so the pid is still ours (at worst a zombie)
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      mid_save += a_save_is_under_way(out);
    }
    REQUIRE_MESSAGE((WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0)), "attempt ", k, ": ",
                    read_file(dir + "/log.txt"));
  }
  std::vector<std::string> last = args;
  if (fs::exists(out + "/train_state.safetensors")) last.push_back("--resume");
  pid_t child = start_finetune(dir, last, dir + "/log.txt");
  waitpid(child, &status, 0);
  REQUIRE_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), read_file(dir + "/log.txt"));
  MESSAGE(kills, " kills (seed ", env_int("FT_KILL_SEED", 20261124), "), ", mid_save,
          " of them left a save's temp file behind");
  for (const char* file : {"adapter/adapter_model.safetensors", "adapter/adapter_config.json"}) {
    CAPTURE(file);
    const std::string expected = read_file(full_dir + "/out/" + file);
    REQUIRE(!expected.empty());
    CHECK(read_file(out + "/" + file) == expected);  // byte for byte
  }
  CHECK(train_losses(out + "/metrics.jsonl") == train_losses(full_dir + "/out/metrics.jsonl"));
}

namespace {

// A tmpfs mounted over a folder for one test, unmounted at the end.
struct SmallDisk {
  std::string folder;
  bool mounted = false;
  SmallDisk(const std::string& where, const std::string& size) : folder(where) {
    fs::create_directories(folder);
    mounted = ::mount("tmpfs", folder.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
    if (!mounted) MESSAGE("cannot mount a tmpfs on ", folder, " (", std::strerror(errno), ")");
  }
  ~SmallDisk() {
    if (mounted) ::umount2(folder.c_str(), MNT_DETACH);
  }
};

// Fills the folder's filesystem until at most keep_bytes are free.
void fill_disk(const std::string& folder, uint64_t keep_bytes) {
  struct statvfs info {};
  REQUIRE(::statvfs(folder.c_str(), &info) == 0);
  const uint64_t free_bytes = uint64_t(info.f_bavail) * info.f_frsize;
  REQUIRE(free_bytes > keep_bytes);
  std::ofstream(folder + "/filler", std::ios::binary) << std::string(free_bytes - keep_bytes, 'x');
}

}  // namespace

// Needs root to mount a tmpfs: ctest runs it as test_finetune_cli_full_disk,
// which reports it skipped (exit 77) elsewhere.
TEST_CASE("a full disk: the save fails with exit 1 naming the path and errno, the previous checkpoint resumes" *
          doctest::skip()) {
  const std::string dir = (fs::path(FT_BINARY_DIR) / "cli_runs" / "full_disk").string();
  ::umount2((dir + "/out").c_str(), MNT_DETACH);  // left by a run that was killed
  make_run_dir("full_disk");
  if (::geteuid() != 0) {
    MESSAGE("skipped: mounting a small tmpfs needs root");
    std::exit(77);
  }
  SmallDisk disk(dir + "/out", "1m");
  if (!disk.mounted) std::exit(77);
  const std::string finetune =
      "cd " + dir + " && " + kBinary + " config.yaml --set grad_accum_steps=1 --set save_every=2 --set max_steps=";
  CommandResult first = run_command(finetune + "4");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  // Room for metrics.jsonl rewritten on resume, not for a training state (~22 KB).
  fill_disk(dir + "/out", 12 * 1024);
  CommandResult full = run_command(finetune + "8 --resume");
  INFO(full.output);
  CHECK(full.exit_code == 1);
  CHECK(full.output.find("resumed at step 4") != std::string::npos);
  CHECK(full.output.find("error: out/train_state.safetensors: cannot save (writing out/train_state.safetensors.tmp: "
                         "No space left on device); the previous train_state.safetensors, if any, is unchanged") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/out/train_state.safetensors.tmp"));

  fs::remove(dir + "/out/filler");
  CommandResult resumed = run_command(finetune + "8 --resume");
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK(resumed.output.find("resumed at step 4") != std::string::npos);
  CHECK(fs::exists(dir + "/out/adapter/adapter_model.safetensors"));
}

namespace {

// input_ids [1, T] and the logits [T, V] of the fixture's base in f32 with the
// adapter in `folder`, written as folder/../adapter_logits.safetensors for
// scripts/check_adapter_in_peft.py (PEFT on the same base and adapter).
void write_adapter_logits(const std::string& model_dir, const std::string& folder) {
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.quantized_base = QuantizedBase::none;
  options.lora = read_peft_adapter_config(folder).lora;
  const ModelConfig config = read_model_config(model_dir + "/config.json");
  std::unique_ptr<CausalLM> model = make_causal_lm(config, backend, options);
  model->load(Checkpoint(model_dir));
  load_peft_adapter(folder, *model);
  const int64_t T = 24;
  std::vector<int32_t> ids(T), targets(T, -100);
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((37 * t + 5) % config.vocab_size);
  Tensor input_ids = Tensor::view_of(ids.data(), {1, T}, DType::i32);
  model->forward(input_ids, Tensor::view_of(targets.data(), {1, T}, DType::i32));
  save_safetensors((fs::path(folder).parent_path() / "adapter_logits.safetensors").string(),
                   {{"input_ids", input_ids}, {"logits", model->last_logits()}});
}

}  // namespace

TEST_CASE("Llama-3-style and Qwen2-style checkpoints with their tokenizer.json pipelines fine-tune end to end") {
  // Saved by transformers 5 (save_pretrained of model and tokenizer), as a user downloads them:
  // rope llama3 and tied embeddings; q/k/v biases and untied embeddings.
  for (const std::string fixture : {"llama3_tiny", "qwen2_tiny"}) {
    CAPTURE(fixture);
    const std::string model_dir = kFixtures + "/" + fixture, dir = make_run_dir(fixture);
    CommandResult result = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=8" +
                                       " --set grad_accum_steps=1 --set lr=1.0e-2 --set model=" + model_dir +
                                       " --set tokenizer=");
    INFO(result.output);
    REQUIRE(result.exit_code == 0);
    // PEFT's count for q_proj and v_proj: 2 layers x (4 x (32 + 32) + 4 x (32 + 16)).
    CHECK(result.output.find("trainable params: 896 ||") != std::string::npos);
    const auto losses = train_losses(dir + "/out/metrics.jsonl");
    REQUIRE(losses.size() == 8);
    CHECK(losses.rbegin()->second < losses.begin()->second);
    const std::string adapter = dir + "/out/adapter";
    nlohmann::json saved = nlohmann::json::parse(std::ifstream(adapter + "/adapter_config.json"));
    CHECK(saved["target_modules"].size() == 2);  // PEFT's default for llama and qwen2: q_proj, v_proj
    write_adapter_logits(model_dir, adapter);
    CHECK(fs::exists(dir + "/out/adapter_logits.safetensors"));
  }
}

TEST_CASE("generate streams text from a trained adapter; the merged checkpoint and the uncached path say the same") {
  const std::string dir = make_run_dir("generate");
  REQUIRE(run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=2 --set save_every=0").exit_code ==
          0);
  const std::string model = kFixtures + "/llama_gqa", tokenizer = kFixtures + "/tokenizer/tokenizer.model";
  const std::string generate = kBinary + " generate " + model + " --tokenizer " + tokenizer + " --device cpu ";
  const std::string prompt = " --prompt 'The cat' --max-new-tokens 12 --ignore-eos";
  CommandResult cached = run_command(generate + "--adapter " + dir + "/out/adapter" + prompt + " 2>/dev/null");
  REQUIRE(cached.exit_code == 0);
  CHECK(cached.output.size() > 1);
  CommandResult uncached =
      run_command(generate + "--adapter " + dir + "/out/adapter" + prompt + " --no-kv-cache 2>/dev/null");
  CHECK(uncached.output == cached.output);
  const std::string adapter_prompt = "--adapter " + dir + "/out/adapter --max-new-tokens 12 --ignore-eos";
  CHECK(run_command("echo 'The cat' | " + generate + adapter_prompt + " --interactive 2>/dev/null").output ==
        cached.output);
  CommandResult timing = run_command(generate + "--adapter " + dir + "/out/adapter" + prompt + " 2>&1 >/dev/null");
  CHECK(timing.output.find("generate: 12 new tokens in ") != std::string::npos);
  // An empty prompt is the BOS token alone (transformers' generate without input_ids): it still generates.
  CHECK(run_command(generate + "--prompt '' --max-new-tokens 3 --ignore-eos 2>&1 >/dev/null").output.find(
            "generate: 3 new tokens in ") != std::string::npos);
  // More new tokens than the 64 positions hold: the stop is said, with the counts.
  CHECK(run_command(generate + "--prompt '' --max-new-tokens 100 --ignore-eos 2>&1 >/dev/null").output.find(
            "generate: stopped after 63 of 100 new tokens: with the prompt's 1 they fill the model's 64 positions") !=
        std::string::npos);

  REQUIRE(run_command(kBinary + " merge " + model + " --adapter " + dir + "/out/adapter --out " + dir + "/merged")
              .exit_code == 0);
  const std::string merged = kBinary + " generate " + dir + "/merged --tokenizer " + tokenizer + " --device cpu ";
  // merge folds the adapter into the full-precision weights: the adapter over the unquantised base says the same
  // (by default generate runs it over the INT8 base it was trained on, as its finetune_run.json records).
  const CommandResult full_precision =
      run_command(generate + "--adapter " + dir + "/out/adapter --quantization none" + prompt + " 2>/dev/null");
  CHECK(run_command(merged + prompt + " 2>/dev/null").output == full_precision.output);

  std::ofstream(dir + "/prompts.jsonl") << "{\"prompt\": \"The cat\"}\n\n{\"prompt\": \"A dog\", \"completion\": \"x\"}\n";
  CommandResult file = run_command(generate + "--file " + dir + "/prompts.jsonl --max-new-tokens 4 2>/dev/null");
  REQUIRE(file.exit_code == 0);
  std::istringstream lines(file.output);
  std::string line;
  std::vector<std::string> prompts;
  while (std::getline(lines, line)) prompts.push_back(nlohmann::json::parse(line)["prompt"]);
  CHECK(prompts == std::vector<std::string>{"The cat", "A dog"});
}

TEST_CASE("generate on a T5 (FLAN-T5's kind) prints transformers' greedy text, with and without a PEFT adapter; "
          "merged, the same") {
  // tests/fixtures/t5_generate (scripts/make_t5_generate_fixture.py): the embedded tiny T5, a SEQ_2_SEQ_LM
  // adapter, and T5ForConditionalGeneration.generate()'s greedy text for three dialogue prompts.
  const nlohmann::json reference = nlohmann::json::parse(read_file(kFixtures + "/t5_generate/reference.json"));
  const std::string dir = (fs::path(FT_BINARY_DIR) / "cli_runs" / "generate_t5").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream prompts(dir + "/prompts.jsonl");
  for (const auto& prompt : reference["prompts"]) prompts << nlohmann::json{{"prompt", prompt}}.dump() << "\n";
  prompts.close();
  const std::string adapter = " --adapter " + kFixtures + "/t5_generate/adapter";
  const std::string generate = kBinary + " generate " + FT_SOURCE_DIR + "/configs/tiny-t5 --tokenizer " +
                               FT_SOURCE_DIR + "/configs/tiny-base/tokenizer.model --device cpu --max-new-tokens " +
                               std::to_string(int(reference["max_new_tokens"])) + " ";
  const std::string penalty = " --repetition-penalty " + std::to_string(double(reference["repetition_penalty"]));
  for (const auto& [run, options] : std::vector<std::pair<std::string, std::string>>{
           {"base", ""}, {"adapter", adapter}, {"adapter_repetition_penalty", adapter + penalty}}) {
    CAPTURE(run);
    const CommandResult file = run_command(generate + "--file " + dir + "/prompts.jsonl" + options + " 2>/dev/null");
    REQUIRE(file.exit_code == 0);
    std::istringstream lines(file.output);
    std::vector<std::string> completions;
    for (std::string line; std::getline(lines, line);) completions.push_back(nlohmann::json::parse(line)["completion"]);
    REQUIRE(completions.size() == 3);
    for (size_t i = 0; i < 3; ++i) CHECK(completions[i] == reference[run][i]["text"].get<std::string>());
  }
  // --prompt streams the same text, the cached and uncached decoders alike; --interactive too.
  const std::string prompt = reference["prompts"][1];
  const std::string want = reference["adapter"][1]["text"].get<std::string>() + "\n";
  std::ofstream(dir + "/prompt.txt") << prompt;
  const std::string quoted = " --prompt \"$(cat " + dir + "/prompt.txt)\"";
  CHECK(run_command(generate + adapter + quoted + " 2>/dev/null").output == want);
  CHECK(run_command(generate + adapter + quoted + " --no-kv-cache 2>/dev/null").output == want);
  // merge folds the adapter into the T5's weights: the merged folder says the same without it.
  REQUIRE(run_command(kBinary + " merge " + FT_SOURCE_DIR + "/configs/tiny-t5" + adapter + " --out " + dir + "/merged")
              .exit_code == 0);
  const std::string merged = kBinary + " generate " + dir + "/merged --tokenizer " + FT_SOURCE_DIR +
                             "/configs/tiny-base/tokenizer.model --device cpu --max-new-tokens 16";
  CHECK(run_command(merged + quoted + " 2>/dev/null").output == want);
  // --chat has no template to render for a T5: one error naming it.
  const CommandResult chat = run_command(generate + adapter + " --prompt hi --chat");
  CHECK(chat.exit_code == 1);
  CHECK(chat.output.find("generate: --chat: " + std::string(FT_SOURCE_DIR) +
                         "/configs/tiny-t5 is an encoder-decoder model (T5), which has no chat template") !=
        std::string::npos);
  // A stop text ends the row where it starts, as for a decoder-only model.
  const std::string cut = want.substr(0, want.find("#Person1#")) + "\n";
  REQUIRE(cut.size() < want.size());
  CHECK(run_command(generate + adapter + quoted + " --stop '#Person1#' 2>/dev/null").output == cut);
}

TEST_CASE("chat rows fine-tune end to end, with built-in and checkpoint templates; without one the run names tokenizer_config.json") {
  // Conversations from the pretraining text (seq_len is 64): the user gives a line's opening words, the
  // assistant the next few.
  const std::string dir = make_run_dir("chat");
  std::ifstream source(std::string(FT_SOURCE_DIR) + "/configs/data/pretrain.jsonl");
  std::ofstream train(dir + "/train.jsonl"), eval(dir + "/eval.jsonl");
  std::string line;
  for (int i = 0; i < 260 && std::getline(source, line); ++i) {
    const std::string text = nlohmann::json::parse(line)["text"];
    const size_t cut = text.find(' ', 16), end = text.find(' ', cut + 24);
    nlohmann::json messages = nlohmann::json::array(
        {{{"role", "system"}, {"content", "Continue."}},
         {{"role", "user"}, {"content", text.substr(0, cut)}},
         {{"role", "assistant"}, {"content", text.substr(cut + 1, end - cut - 1)}}});
    (i < 240 ? train : eval) << nlohmann::json{{"messages", messages}}.dump() << "\n";
  }
  train.close(), eval.close();
  const std::string qwen2 = " --set model=" + kFixtures + "/qwen2_tiny --set tokenizer= --set data.packing=false";
  CommandResult refused = run_command("cd " + dir + " && " + kBinary + " config.yaml" + qwen2);
  CHECK(refused.exit_code == 1);
  CHECK(refused.output.find(kFixtures + "/qwen2_tiny/tokenizer_config.json: no chat_template to render chat rows "
                                        "with; set data.chat_template to one of chatml, llama2, llama3, zephyr") !=
        std::string::npos);
  CHECK(refused.output.find("trainable params") == std::string::npos);  // refused before the weights load
  // ChatML over Qwen2's tokenizer.json; Llama-2's template over the SentencePiece fixture tokenizer.
  for (const std::string& settings : {qwen2 + " --set data.chat_template=chatml", std::string(" --set data.chat_template=llama2")}) {
    CAPTURE(settings);
    CommandResult result = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=8" +
                                       " --set grad_accum_steps=1 --set lr=1.0e-2 --set output_dir=out_chat" + settings);
    INFO(result.output);
    REQUIRE(result.exit_code == 0);
    CHECK(result.output.find("train: 240 examples") != std::string::npos);
    const auto losses = train_losses(dir + "/out_chat/metrics.jsonl");
    REQUIRE(losses.size() == 8);
    CHECK(losses.rbegin()->second < losses.begin()->second);
    fs::remove_all(dir + "/out_chat");
  }
  // data.chat_template: auto runs the checkpoint's own template: Llama-3.1's (a dated system header before the
  // conversation's system message), in a copy of the tiny Llama-3 checkpoint's chat_template.jinja.
  const std::string llama31 = dir + "/llama3_1_tiny";
  fs::copy(kFixtures + "/llama3_tiny", llama31);
  std::ifstream config_json(kFixtures + "/chat/llama3_1/tokenizer_config.json");
  std::ofstream(llama31 + "/chat_template.jinja") << nlohmann::json::parse(config_json)["chat_template"].get<std::string>();
  CommandResult llama = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=8" +
                                    " --set grad_accum_steps=1 --set lr=1.0e-2 --set output_dir=out_chat --set model=" +
                                    llama31 + " --set tokenizer= --set data.packing=false --set seq_len=128");
  INFO(llama.output);
  REQUIRE(llama.exit_code == 0);
  CHECK(llama.output.find("chat template: auto (" + llama31 + "/chat_template.jinja)") != std::string::npos);
  const auto losses = train_losses(dir + "/out_chat/metrics.jsonl");
  REQUIRE(losses.size() == 8);
  CHECK(losses.rbegin()->second < losses.begin()->second);
}

TEST_CASE("objective: dpo refuses rows that are not preference pairs, full fine-tuning and a bad beta or loss") {
  const std::string dir = make_run_dir("dpo_bad");
  const std::string dpo = "config.yaml --set objective=dpo --set data.packing=false ";
  struct Case {
    std::string arguments, expected;
  };
  const Case cases[] = {
      {dpo, "train.jsonl:1: row lacks \"chosen\": expected \"chosen\" and \"rejected\" strings or lists of "
            "messages, and the \"prompt\" they follow (preference pairs: objective: dpo and reward read them), got "
            "keys \"text\""},
      {dpo + "--set trainable=all --set quantization.mode=none",
       "objective: dpo needs trainable: lora: its reference model is the base with the adapters disabled"},
      {dpo + "--set data.packing=concatenate", "data.packing: concatenate applies to objective: sft only"},
      {dpo + "--set data.format=text", "data.format applies to objective: sft only"},
      {dpo + "--set dpo.beta=0", "dpo.beta: expected a number in (0, 1e6], got \"0\""},
      {dpo + "--set dpo.loss_type=hinge", "dpo.loss_type: expected one of sigmoid, ipo, got \"hinge\""},
      {dpo + "--set objective=rlhf", "objective: expected one of sft, dpo, reward, grpo, ppo, got \"rlhf\""},
      {dpo + "--set task_metric=rouge", "task_metric: rouge scores completions (objective: sft)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.arguments);
    CommandResult result = run_command("cd " + dir + " && " + kBinary + " " + c.arguments);
    CHECK(result.exit_code == 1);
    CHECK_MESSAGE(result.output.find(c.expected) != std::string::npos, result.output);
  }
}

TEST_CASE("configs/dpo-tiny.yaml run briefly raises the preference accuracy on held-out pairs") {
  const fs::path out = fs::path(FT_BINARY_DIR) / "cli_runs" / "dpo_tiny";
  fs::remove_all(out);
  CommandResult result = run_command(kBinary + " " + FT_SOURCE_DIR + "/configs/dpo-tiny.yaml --set max_steps=6" +
                                     " --set warmup_steps=0 --set eval_batches=2 --set generate.num_samples=0" +
                                     " --set output_dir=" + out.string());
  REQUIRE_MESSAGE(result.exit_code == 0, result.output);
  CHECK(result.output.find("eval rewards/accuracies (held-out pairs) 0.0000 -> ") != std::string::npos);
  std::map<int64_t, double> accuracy;
  int64_t train_rows = 0;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains("eval_rewards/accuracies")) accuracy[row["step"]] = row["eval_rewards/accuracies"];
    train_rows += row.contains("rewards/margins") && row.contains("logps/rejected");
  }
  CHECK(train_rows == 6);
  REQUIRE(accuracy.size() == 2);
  MESSAGE("held-out rewards/accuracies ", accuracy[0], " -> ", accuracy[6]);
  // Before training the policy is the reference: every reward is 0, no pair is ranked.
  CHECK(accuracy[0] == 0.0);
  CHECK(accuracy[6] >= 0.5);
}

// ---------------------------------------------------------------------------
// Data parallel: `mpirun -np 2` on the shipped tiny model (configs/default.yaml
// shortened), on the CPU, one OpenMP thread per rank and in the single
// process compared with. ctest runs these cases as
// test_finetune_cli_data_parallel and ..._kill; a build without MPI (no mpirun found at
// configure time) exits 77 there, which ctest reports as skipped. With
// FT_TEST_DEVICE=cuda (the ..._2gpu entries, label gpu) the same runs train
// on GPUs, one per rank, and exit 77 on a machine with fewer than two.

namespace {

const std::string kMpirun = FT_MPIRUN;

std::string test_device() {
  const char* device = std::getenv("FT_TEST_DEVICE");
  return device ? device : "cpu";
}

void skip_without_mpirun() {
  if (kMpirun.empty()) {
    MESSAGE("skipped: this build has no MPI (install libopenmpi-dev openmpi-bin: scripts/deps)");
    std::exit(77);
  }
  std::string why;
  if (test_device() == "cuda" && ft::cuda_device_count(&why) < 2) {
    MESSAGE("skipped: two ranks on GPUs need two GPUs (", why.empty() ? "one found" : why, ")");
    std::exit(77);
  }
}

// An mpirun test's folder, made empty (cli_runs/<name>), after skipping
// where the test cannot run; one OpenMP thread, also for the one-process run
// it is compared with: the same summation order within each op.
std::string mpirun_test_dir(const std::string& name) {
  skip_without_mpirun();
  setenv("OMP_NUM_THREADS", "1", 1);
  const std::string dir = (fs::path(FT_BINARY_DIR) / "cli_runs" / name).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// As root Open MPI wants --allow-run-as-root; --oversubscribe lets the ranks
// share fewer cores than ranks. Nothing else was needed in this container.
std::vector<std::string> with_mpirun(int ranks, const std::vector<std::string>& finetune_args) {
  std::vector<std::string> args = {"--allow-run-as-root", "--oversubscribe", "-np", std::to_string(ranks),
                                   "-x",                  "OMP_NUM_THREADS=1", kBinary};
  args.insert(args.end(), finetune_args.begin(), finetune_args.end());
  return args;
}

// A few steps of the default run, small enough for two ranks on two cores:
// LoRA r=16 on q/v with dropout 0.05 over the INT8 tiny model, AdamW, clipping.
std::vector<std::string> short_default_run(const std::string& output_dir, int64_t grad_accum_steps, int64_t steps) {
  std::vector<std::string> args = {std::string(FT_SOURCE_DIR) + "/configs/default.yaml"};
  for (const std::string& set : std::vector<std::string>{
           "device=" + test_device(), "seq_len=160", "micro_batch_size=2", "save_every=2", "eval_batches=1", "task_metric=none",
        "generate.num_samples=0", "grad_accum_steps=" + std::to_string(grad_accum_steps),
        "max_steps=" + std::to_string(steps), "output_dir=" + output_dir}) {
    args.push_back("--set");
    args.push_back(set);
  }
  return args;
}

int exit_code_of(pid_t pid) {
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct Ran {
  int exit_code;
  std::string output;
};

// ranks 0: finetune alone; else under mpirun.
Ran run_ranks(int ranks, const std::vector<std::string>& args, const std::string& dir, const std::string& log_name) {
  const std::string log = dir + "/" + log_name;
  const int code = exit_code_of(ranks == 0 ? start_finetune(dir, args, log)
                                           : start_program(kMpirun, dir, with_mpirun(ranks, args), log));
  return {code, read_file(log)};
}

std::map<std::string, std::vector<float>> adapter_weights(const std::string& adapter_dir) {
  SafetensorsFile file(adapter_dir + "/adapter_model.safetensors");
  std::map<std::string, std::vector<float>> weights;
  for (const SafetensorsEntry& entry : file.entries()) {
    REQUIRE(entry.dtype == DType::f32);
    const float* values = static_cast<const float*>(entry.data);
    weights[entry.name].assign(values, values + entry.size_bytes / sizeof(float));
  }
  return weights;
}

// The largest difference between two adapters' weights, and the largest
// |lora_B| of the first.
float max_adapter_difference(const std::string& a_dir, const std::string& b_dir, float* largest_lora_b) {
  const auto a = adapter_weights(a_dir), b = adapter_weights(b_dir);
  REQUIRE(a.size() == b.size());
  float difference = 0.0f;
  for (const auto& [name, values] : a) {
    REQUIRE(b.count(name));
    REQUIRE(b.at(name).size() == values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      difference = std::max(difference, std::abs(values[i] - b.at(name)[i]));
      if (name.find("lora_B") != std::string::npos) *largest_lora_b = std::max(*largest_lora_b, std::abs(values[i]));
    }
  }
  return difference;
}

// The largest |a - b| / |a| over the steps both hold (every step of a).
double max_relative_difference(const std::map<int64_t, double>& a, const std::map<int64_t, double>& b) {
  double largest = 0.0;
  for (const auto& [step, value] : a) {
    REQUIRE(b.count(step));
    largest = std::max(largest, std::abs(value - b.at(step)) / std::abs(value));
  }
  return largest;
}

// The processes whose parent is parent.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t name_end = line.rfind(')');  // "pid (comm) state ppid ...": comm may hold spaces
    if (name_end == std::string::npos) continue;
    std::istringstream rest(line.substr(name_end + 1));
    char state = 0;
    pid_t ppid = 0;
    if (rest >> state >> ppid && ppid == parent) children.push_back(pid_t(std::stol(name)));
  }
  return children;
}

// The finetune processes below an mpirun: its children with Open MPI 4, its
// daemon's with Open MPI 5.
std::vector<pid_t> ranks_of(pid_t job) {
  std::vector<pid_t> ranks, below = children_of(job);
  for (size_t i = 0; i < below.size(); ++i) {
    std::error_code error;
    if (fs::read_symlink("/proc/" + std::to_string(below[i]) + "/exe", error) == fs::weakly_canonical(kBinary))
      ranks.push_back(below[i]);
    for (pid_t child : children_of(below[i])) below.push_back(child);
  }
  return ranks;
}

}  // namespace

TEST_CASE("data parallel: mpirun -np 2 trains as one process with twice the gradient accumulation" *
          doctest::skip()) {
  const std::string dir = mpirun_test_dir("data_parallel");

  std::vector<std::string> too_many = short_default_run(dir + "/bad", 2, 4);
  too_many.insert(too_many.end(), {"--set", "parallel.data=4"});
  const Ran refused = run_ranks(2, too_many, dir, "too_many.txt");
  CHECK(refused.exit_code != 0);
  CHECK(refused.output.find("error (rank ") != std::string::npos);
  CHECK(refused.output.find("parallel.data 4 x parallel.pipeline 1 must equal the job's 2 ranks") !=
        std::string::npos);
  // The other objectives run in one process: the refusal names the run's own.
  std::vector<std::string> reward = short_default_run(dir + "/bad", 2, 4);
  reward.insert(reward.end(), {"--set", "objective=reward"});
  const Ran one_process = run_ranks(2, reward, dir, "reward.txt");
  CHECK(one_process.exit_code != 0);
  CHECK(one_process.output.find("objective: reward runs in one process; a job of 2 ranks") != std::string::npos);

  // An MPMD launch with another --set on rank 1 is refused before any work
  // (its ranks would train different step counts and hang in a sum).
  std::vector<std::string> mpmd = with_mpirun(1, short_default_run(dir + "/bad", 2, 4));
  const std::vector<std::string> other = with_mpirun(1, short_default_run(dir + "/bad", 2, 6));
  mpmd.push_back(":");
  mpmd.insert(mpmd.end(), other.begin() + 2, other.end());  // its own -np, -x and command
  const int mpmd_code = exit_code_of(start_program(kMpirun, dir, mpmd, dir + "/mpmd.txt"));
  const std::string mpmd_output = read_file(dir + "/mpmd.txt");
  INFO(mpmd_output);
  CHECK(mpmd_code != 0);
  CHECK(mpmd_output.find("1 of the job's 2 ranks run another command than rank 0") != std::string::npos);
  CHECK(mpmd_output.find("--set max_steps=6 --set output_dir=") != std::string::npos);

  // One epoch of the first 32 training examples: 16 micro-batches, 4 steps of
  // 4 micro-batches (one process x 4, or 2 ranks x 2). Over the f32 base: over
  // INT8 the activations are rounded to int8 codes, which now and then turns an
  // f32 rounding difference into a whole quantisation step (measured: losses
  // 1.7e-4 apart after 4 steps), so no tight bound holds there.
  std::ifstream source(std::string(FT_SOURCE_DIR) + "/configs/data/summarize_train.jsonl");
  std::ofstream train(dir + "/train32.jsonl");
  std::string line;
  for (int i = 0; i < 32 && std::getline(source, line); ++i) train << line << "\n";
  train.close();
  const std::vector<std::string> one_epoch = {"--set", "data.train=" + dir + "/train32.jsonl", "--set", "max_steps=0",
                                              "--set", "epochs=1", "--set", "quantization.mode=none"};
  std::vector<std::string> one_args = short_default_run(dir + "/one", 4, 4), two_args = short_default_run(dir + "/two", 2, 4);
  one_args.insert(one_args.end(), one_epoch.begin(), one_epoch.end());
  two_args.insert(two_args.end(), one_epoch.begin(), one_epoch.end());
  const Ran one = run_ranks(0, one_args, dir, "one.txt");
  REQUIRE_MESSAGE(one.exit_code == 0, one.output);
  const Ran two = run_ranks(2, two_args, dir, "two.txt");
  REQUIRE_MESSAGE(two.exit_code == 0, two.output);
  CHECK(two.output.find("training 4 steps of 2 x 2 x 2 ranks (data parallel)") != std::string::npos);

  // Every rank sums the same gradients in another order (its own micro-batches,
  // then across ranks): f32 rounding apart, the same steps. The gradient norm
  // would also catch a wrong scale, which clipping and AdamW hide in the weights.
  const double loss_difference = max_relative_difference(step_metric(dir + "/one/metrics.jsonl", "loss"),
                                                          step_metric(dir + "/two/metrics.jsonl", "loss"));
  const double norm_difference = max_relative_difference(step_metric(dir + "/one/metrics.jsonl", "grad_norm"),
                                                          step_metric(dir + "/two/metrics.jsonl", "grad_norm"));
  CHECK(step_metric(dir + "/two/metrics.jsonl", "loss").size() == 4);
  CHECK(loss_difference <= 1e-6);
  CHECK(norm_difference <= 1e-6);
  float largest_lora_b = 0.0f;
  const float weight_difference =
      max_adapter_difference(dir + "/one/adapter", dir + "/two/adapter", &largest_lora_b);
  // lora_B starts at zero and moves by at most about lr per step (AdamW):
  // 1e-6 is a thousandth of what 4 steps move it.
  CHECK(largest_lora_b > 1e-4f);
  CHECK(weight_difference <= 1e-6f);
  MESSAGE("2 ranks vs 1 process with doubled accumulation: losses differ by at most ", loss_difference,
          " (relative), gradient norms by ", norm_difference, ", adapter weights by ", weight_difference,
          " (largest |lora_B| ", largest_lora_b, ")");

  // ZeRO-1: the same 2 ranks with AdamW's state split between them take the
  // same steps to the bit and write the same files (rank 0 gathers the state).
  std::vector<std::string> sharded_args = short_default_run(dir + "/sharded", 2, 4);
  sharded_args.insert(sharded_args.end(), one_epoch.begin(), one_epoch.end());
  sharded_args.insert(sharded_args.end(), {"--set", "parallel.shard_optimizer=true"});
  const Ran sharded = run_ranks(2, sharded_args, dir, "sharded.txt");
  REQUIRE_MESSAGE(sharded.exit_code == 0, sharded.output);
  CHECK(sharded.output.find("the state is sharded over 2 data-parallel ranks") != std::string::npos);
  for (const char* key : {"loss", "grad_norm", "eval_loss"})
    CHECK(step_metric(dir + "/sharded/metrics.jsonl", key) == step_metric(dir + "/two/metrics.jsonl", key));
  CHECK(read_file(dir + "/sharded/adapter/adapter_model.safetensors") ==
        read_file(dir + "/two/adapter/adapter_model.safetensors"));
  CHECK(read_file(dir + "/sharded/train_state.safetensors") == read_file(dir + "/two/train_state.safetensors"));

  // SIGINT to rank 1 alone: every rank stops after the same step with a checkpoint, and each says SIGINT and
  // exits 130, whichever rank mpirun hears from first.
  const pid_t job = start_program(kMpirun, dir, with_mpirun(2, short_default_run(dir + "/interrupted", 2, 200)),
                                  dir + "/interrupted.txt");
  int status = 0;
  while (waitpid(job, &status, WNOHANG) == 0 && last_logged_step(dir + "/interrupted/metrics.jsonl") < 2)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const std::vector<pid_t> ranks = ranks_of(job);
  REQUIRE(ranks.size() == 2);
  kill(ranks[1], SIGINT);
  waitpid(job, &status, 0);
  const std::string interrupted = read_file(dir + "/interrupted.txt");
  INFO(interrupted);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 130));
  CHECK(interrupted.find("SIGINT: stopped after step ") != std::string::npos);
  CHECK(interrupted.find("SIGTERM") == std::string::npos);
  CHECK(fs::exists(dir + "/interrupted/train_state.safetensors"));
}

namespace {

// A job of 2 ranks (args: its finetune arguments) is killed by kill -9 of
// one rank as its first checkpoint (step 2 of 4) appears: the job ends
// instead of waiting in the next collective, and --resume on 2 ranks ends
// with the adapter and losses of the job run uninterrupted. The checkpoint
// belongs to its layout: resumed by one process (without extra_args) it is
// refused with refused_alone.
void check_kill_and_resume(const std::string& dir, const std::vector<std::string>& extra_args,
                           const std::string& refused_alone) {
  setenv("OMP_NUM_THREADS", "1", 1);
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto job_args = [&](const std::string& output_dir) {
    std::vector<std::string> args = short_default_run(output_dir, 2, 4);
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    return args;
  };
  const Ran full = run_ranks(2, job_args(dir + "/full"), dir, "full.txt");
  REQUIRE_MESSAGE(full.exit_code == 0, full.output);

  const std::vector<std::string> args = job_args(dir + "/out");
  const pid_t job = start_program(kMpirun, dir, with_mpirun(2, args), dir + "/killed.txt");
  int status = 0;
  while (!fs::exists(dir + "/out/train_state.safetensors")) {
    REQUIRE_MESSAGE(waitpid(job, &status, WNOHANG) == 0, "the job ended before its first checkpoint:\n",
                    read_file(dir + "/killed.txt"));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::vector<pid_t> ranks = ranks_of(job);
  REQUIRE(ranks.size() == 2);
  const auto killed_at = std::chrono::steady_clock::now();
  kill(ranks.back(), SIGKILL);
  const int killed_code = exit_code_of(job);
  const double job_end_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  INFO(read_file(dir + "/killed.txt"));
  CHECK(killed_code != 0);
  CHECK(job_end_s < 30.0);  // the other rank did not wait for ever in the next collective
  CHECK(train_losses(dir + "/out/metrics.jsonl").size() < 4);
  MESSAGE("the job ended ", job_end_s, " s after one rank was killed (exit ", killed_code, ")");

  std::vector<std::string> resume = args;
  resume.push_back("--resume");
  const Ran resumed = run_ranks(2, resume, dir, "resumed.txt");
  REQUIRE_MESSAGE(resumed.exit_code == 0, resumed.output);
  CHECK(resumed.output.find("resumed at step ") != std::string::npos);
  CHECK(read_file(dir + "/out/adapter/adapter_model.safetensors") ==
        read_file(dir + "/full/adapter/adapter_model.safetensors"));
  CHECK(train_losses(dir + "/out/metrics.jsonl") == train_losses(dir + "/full/metrics.jsonl"));

  std::vector<std::string> resume_alone = short_default_run(dir + "/out", 2, 4);  // without extra_args
  resume_alone.push_back("--resume");
  const Ran alone = run_ranks(0, resume_alone, dir, "alone.txt");
  CHECK(alone.exit_code == 1);
  CHECK(alone.output.find(refused_alone) != std::string::npos);
  // The base is the same: only the layout is named (the weights are hashed per pipeline stage).
  CHECK(alone.output.find("the base model's weights") == std::string::npos);
}

}  // namespace

TEST_CASE("data parallel: kill -9 of one rank ends the job; --resume on 2 ranks ends with the uninterrupted adapter" *
          doctest::skip()) {
  skip_without_mpirun();
  // With AdamW's state sharded: each rank restores its share of the
  // checkpoint and takes the other's parameters from it. The global batch
  // and data position belong to the rank count.
  check_kill_and_resume((fs::path(FT_BINARY_DIR) / "cli_runs" / "data_parallel_kill").string(),
                        {"--set", "parallel.shard_optimizer=true"},
                        "the data-parallel ranks (mpirun -np): now 1; the checkpoint's: 2");
}

// Pipeline parallel: the same short runs with parallel.pipeline 2 (ctest:
// test_finetune_cli_pipeline and ..._kill). Two stages of the tiny model's
// four layers, over its INT8 base with LoRA dropout and clipping: every
// stage computes its layers as one process does, so everything is equal to
// the bit.
TEST_CASE("pipeline: mpirun -np 2 with parallel.pipeline 2 trains as one process, bit for bit" * doctest::skip()) {
  const std::string dir = mpirun_test_dir("pipeline");
  const std::vector<std::string> two_stages = {"--set", "parallel.pipeline=2"};

  // The default config's ROUGE generates with the whole model, which no rank holds.
  std::vector<std::string> rouge = short_default_run(dir + "/bad", 4, 4);
  rouge.insert(rouge.end(), {"--set", "task_metric=rouge", "--set", "parallel.pipeline=2"});
  const Ran refused = run_ranks(2, rouge, dir, "rouge.txt");
  CHECK(refused.exit_code != 0);
  CHECK(refused.output.find("error (rank ") != std::string::npos);
  CHECK(refused.output.find("parallel.pipeline: 2: task_metric: rouge generates with the whole model") !=
        std::string::npos);

  std::vector<std::string> one_args = short_default_run(dir + "/one", 4, 4),
                           two_args = short_default_run(dir + "/two", 4, 4);
  two_args.insert(two_args.end(), two_stages.begin(), two_stages.end());
  const Ran one = run_ranks(0, one_args, dir, "one.txt");
  REQUIRE_MESSAGE(one.exit_code == 0, one.output);
  const Ran two = run_ranks(2, two_args, dir, "two.txt");
  REQUIRE_MESSAGE(two.exit_code == 0, two.output);
  CHECK(two.output.find("pipeline: stage 0: layers 0-1, stage 1: layers 2-3") != std::string::npos);
  CHECK(two.output.find("through 2 pipeline stages") != std::string::npos);

  for (const char* key : {"loss", "grad_norm", "eval_loss"}) {
    CAPTURE(key);
    const auto alone = step_metric(dir + "/one/metrics.jsonl", key);
    CHECK(!alone.empty());
    if (test_device() == "cpu") CHECK(alone == step_metric(dir + "/two/metrics.jsonl", key));
    else CHECK(max_relative_difference(alone, step_metric(dir + "/two/metrics.jsonl", key)) <= 1e-6);
  }
  CHECK(read_file(dir + "/two/adapter/adapter_config.json") == read_file(dir + "/one/adapter/adapter_config.json"));

  // Each stage hashes only the weights it loads: the checkpoint records every
  // stage's, so a base with other values (one bit of the file's last weight,
  // stage 1's final norm) is refused on --resume.
  fs::copy(std::string(FT_SOURCE_DIR) + "/configs/tiny-base", dir + "/base");
  std::string weights = read_file(dir + "/base/model.safetensors");
  weights[weights.size() - 4] = char(weights[weights.size() - 4] ^ 1);
  std::ofstream(dir + "/base/model.safetensors", std::ios::binary | std::ios::trunc) << weights;
  std::vector<std::string> other_base = two_args;
  other_base.insert(other_base.end(), {"--set", "model=" + dir + "/base", "--set", "max_steps=6", "--resume"});
  const Ran other = run_ranks(2, other_base, dir, "other_base.txt");
  CHECK(other.exit_code != 0);
  CHECK(other.output.find("  the base model's weights (xxHash of every tensor's bytes, " + dir +
                          "/base): now stage 0 xxh3 ") != std::string::npos);
  CHECK(other.output.find("; the checkpoint's: stage 0 xxh3 ") != std::string::npos);
  if (test_device() != "cpu") {
    // On GPUs the gradient norm's reduction splits differently with the
    // stages (sum_squares_many's blocks), which clipping may pass on to the
    // weights in their last bits.
    float largest_lora_b = 0.0f;
    CHECK(max_adapter_difference(dir + "/one/adapter", dir + "/two/adapter", &largest_lora_b) <= 1e-6f);
    CHECK(largest_lora_b > 1e-4f);
    return;
  }
  // The adapter: one PEFT folder, written by rank 0 from both stages' tensors.
  CHECK(read_file(dir + "/two/adapter/adapter_model.safetensors") ==
        read_file(dir + "/one/adapter/adapter_model.safetensors"));
  // The training state: every stage's masters and moments in one file.
  const SafetensorsFile alone(dir + "/one/train_state.safetensors");
  const Checkpoint staged(dir + "/two/train_state.safetensors");
  REQUIRE(alone.entries().size() == staged.names().size());
  for (const SafetensorsEntry& entry : alone.entries()) {
    CAPTURE(entry.name);
    REQUIRE(staged.contains(entry.name));
    const SafetensorsEntry& other = staged.entry(entry.name);
    REQUIRE(other.size_bytes == entry.size_bytes);
    CHECK(std::memcmp(other.data, entry.data, entry.size_bytes) == 0);
  }
}

// lora.layers_to_transform can leave a stage's layers without adapters:
// that stage trains nothing and still passes activations and gradients on.
TEST_CASE("pipeline: mpirun -np 2 with stage 1's layers left without adapters trains as one process" *
          doctest::skip()) {
  const std::string dir = mpirun_test_dir("pipeline_layers");
  std::vector<std::string> one_args = short_default_run(dir + "/one", 2, 2),
                           two_args = short_default_run(dir + "/two", 2, 2);
  for (std::vector<std::string>* args : {&one_args, &two_args})
    args->insert(args->end(), {"--set", "lora.layers_to_transform=[0]"});
  two_args.insert(two_args.end(), {"--set", "parallel.pipeline=2"});
  const Ran one = run_ranks(0, one_args, dir, "one.txt");
  REQUIRE_MESSAGE(one.exit_code == 0, one.output);
  const Ran two = run_ranks(2, two_args, dir, "two.txt");
  REQUIRE_MESSAGE(two.exit_code == 0, two.output);
  CHECK(two.output.find("pipeline: stage 0: layers 0-1, stage 1: layers 2-3") != std::string::npos);
  const SafetensorsFile adapter(dir + "/two/adapter/adapter_model.safetensors");
  CHECK(adapter.entries().size() == 4);  // layer 0's q_proj and v_proj
  for (const SafetensorsEntry& entry : adapter.entries()) CHECK(entry.name.find(".layers.0.") != std::string::npos);
  if (test_device() != "cpu") {
    float largest_lora_b = 0.0f;
    CHECK(max_adapter_difference(dir + "/one/adapter", dir + "/two/adapter", &largest_lora_b) <= 1e-6f);
    return;
  }
  CHECK(step_metric(dir + "/one/metrics.jsonl", "loss") == step_metric(dir + "/two/metrics.jsonl", "loss"));
  CHECK(read_file(dir + "/two/adapter/adapter_model.safetensors") ==
        read_file(dir + "/one/adapter/adapter_model.safetensors"));
}

TEST_CASE("pipeline: kill -9 of one stage ends the job; --resume on 2 ranks ends with the uninterrupted adapter" *
          doctest::skip()) {
  skip_without_mpirun();
  check_kill_and_resume((fs::path(FT_BINARY_DIR) / "cli_runs" / "pipeline_kill").string(),
                        {"--set", "parallel.pipeline=2"},
                        "parallel.pipeline: the checkpoint's: 2; none in this run");
}

// Tensor parallel (ctest: test_finetune_cli_tensor_parallel, ..._4 and
// ..._kill): every layer split over the ranks, LoRA on every linear so that
// both split kinds train (column-parallel q/k/v/gate/up, row-parallel
// o/down), dropout on. The ranks sum partial products in another order than
// one process's GEMMs, so f32 rounding apart.
namespace {

const std::vector<std::string> kTensorLora = {"--set", "lora.target_modules=all-linear", "--set",
                                              "quantization.mode=none"};

// One process and a parallel job of the same steps: losses, gradient norms
// and eval losses within 1e-6 (relative), and the same adapter tensors
// (names, whole shapes, config). The weights: AdamW moves an element by
// about lr g / (|g| + eps), so where a gradient is near 0 (|g| ~ eps = 1e-8,
// f32 rounding noise of the larger gradients) the two runs' roundings move
// it differently, up to a fraction of lr (measured on 2 ranks: 41 elements
// of 217,088 beyond 1e-6, the largest 2.95e-5 with oneDNN's AVX-512 GEMMs,
// 1.2e-4 with the reference GEMMs an AVX2 machine runs; lr 1e-4 to 4e-4).
// So: at most 1 in 1,000 elements beyond 1e-6, none beyond 2e-4 (an eighth
// of what 4 steps of lr move a weight at most; a misplaced shard moves
// lora_A's ~0.07 values, a wrong gradient most elements).
void check_equals_one_process(const std::string& dir, const std::string& one, const std::string& job) {
  for (const std::string key : {"loss", "grad_norm", "eval_loss"}) {
    CAPTURE(key);
    const auto alone = step_metric(dir + "/" + one + "/metrics.jsonl", key);
    CHECK(alone.size() >= 2);
    const double difference = max_relative_difference(alone, step_metric(dir + "/" + job + "/metrics.jsonl", key));
    CHECK(difference <= 1e-6);
    MESSAGE(job, " vs ", one, ": ", key, " within ", difference);
  }
  const auto a = adapter_weights(dir + "/" + one + "/adapter"), b = adapter_weights(dir + "/" + job + "/adapter");
  REQUIRE(a.size() == b.size());
  int64_t elements = 0, beyond = 0;
  float worst = 0.0f, largest_lora_b = 0.0f;
  for (const auto& entry : a) {
    const std::string& name = entry.first;
    REQUIRE(b.count(name));
    REQUIRE(b.at(name).size() == entry.second.size());
    for (size_t i = 0; i < entry.second.size(); ++i) {
      const float difference = std::abs(entry.second[i] - b.at(name)[i]);
      worst = std::max(worst, difference);
      beyond += difference > 1e-6f;
      if (name.find("lora_B") != std::string::npos)
        largest_lora_b = std::max(largest_lora_b, std::abs(entry.second[i]));
    }
    elements += int64_t(entry.second.size());
  }
  CHECK(largest_lora_b > 1e-4f);
  CHECK(worst <= 2e-4f);
  CHECK(beyond * 1000 <= elements);
  MESSAGE(job, " vs ", one, ": adapter weights within ", worst, ", ", beyond, " of ", elements,
          " elements beyond 1e-6");
  CHECK(read_file(dir + "/" + job + "/adapter/adapter_config.json") ==
        read_file(dir + "/" + one + "/adapter/adapter_config.json"));
}

}  // namespace

TEST_CASE("tensor parallel: mpirun -np 2 with parallel.tensor 2 trains as one process" * doctest::skip()) {
  const std::string dir = mpirun_test_dir("tensor_parallel");
  auto job = [&](const std::string& name, int ranks, std::vector<std::string> extra) {
    std::vector<std::string> args = short_default_run(dir + "/" + name, 4, 4);
    args.insert(args.end(), kTensorLora.begin(), kTensorLora.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return run_ranks(ranks, args, dir, name + ".txt");
  };
  const Ran one = job("one", 0, {});
  REQUIRE_MESSAGE(one.exit_code == 0, one.output);
  const Ran two = job("two", 2, {"--set", "parallel.tensor=2"});
  REQUIRE_MESSAGE(two.exit_code == 0, two.output);
  CHECK(two.output.find("each layer split over 2 tensor-parallel ranks") != std::string::npos);
  // The whole model's count, as one process prints it.
  const std::string count_line = "trainable params: ";
  CHECK(two.output.substr(two.output.find(count_line), 80) == one.output.substr(one.output.find(count_line), 80));
  check_equals_one_process(dir, "one", "two");

  // Over the default INT8 base (row-parallel shards take the whole rows'
  // scales through an MPI max): LLM.int8() turns the f32 rounding of the
  // sums into whole int8 codes, as far as one ulp of one process's input
  // does (tests/test_tensor_parallel.cpp), so within 1% (measured: losses
  // 1.5e-3, gradient norms 3.8e-3, eval losses 2.4e-3).
  const Ran one_int8 = job("one_int8", 0, {"--set", "quantization.mode=int8"});
  REQUIRE_MESSAGE(one_int8.exit_code == 0, one_int8.output);
  const Ran two_int8 = job("two_int8", 2, {"--set", "quantization.mode=int8", "--set", "parallel.tensor=2"});
  REQUIRE_MESSAGE(two_int8.exit_code == 0, two_int8.output);
  for (const std::string key : {"loss", "grad_norm", "eval_loss"}) {
    CAPTURE(key);
    const double difference = max_relative_difference(step_metric(dir + "/one_int8/metrics.jsonl", key),
                                                       step_metric(dir + "/two_int8/metrics.jsonl", key));
    CHECK(difference <= 1e-2);
    MESSAGE("INT8 two vs one: ", key, " within ", difference);
  }

  // What it refuses, naming the key.
  const Ran rouge = job("rouge", 2, {"--set", "parallel.tensor=2", "--set", "task_metric=rouge"});
  CHECK(rouge.exit_code != 0);
  CHECK(rouge.output.find("parallel.tensor: 2: task_metric: rouge generates with the whole model") !=
        std::string::npos);
  const Ran uneven = job("uneven", 2, {"--set", "parallel.tensor=4"});
  CHECK(uneven.exit_code != 0);
  CHECK(uneven.output.find("parallel.pipeline 1 x parallel.tensor 4 must divide the job's 2 ranks") !=
        std::string::npos);
  if (test_device() != "cpu") return;  // 4 ranks: more than the _2gpu entry's GPUs
  const Ran heads = job("heads", 4, {"--set", "parallel.tensor=4"});  // the tiny model has 6 heads
  CHECK(heads.exit_code != 0);
  CHECK(heads.output.find("default.yaml: parallel.tensor: 4: the ranks must divide num_attention_heads (6)") !=
        std::string::npos);
}

TEST_CASE("tensor parallel: mpirun -np 4 with tensor 4, data 2 x tensor 2 and pipeline 2 x tensor 2 train as one "
          "process" *
          doctest::skip()) {
  const std::string dir = mpirun_test_dir("tensor_parallel_4");
  // A model with 8 heads, 4 key/value heads and NF4 blocks whole in every
  // shard (tests/fixtures/tensor_parallel, random weights).
  auto job = [&](const std::string& name, int ranks, int64_t grad_accum_steps, std::vector<std::string> extra) {
    std::vector<std::string> args = short_default_run(dir + "/" + name, grad_accum_steps, 3);
    args.insert(args.end(), kTensorLora.begin(), kTensorLora.end());
    args.insert(args.end(), {"--set", "model=" + std::string(FT_FIXTURES_DIR) + "/tensor_parallel", "--set",
                             "tokenizer=" + std::string(FT_SOURCE_DIR) + "/configs/tiny-base/tokenizer.model",
                             "--set", "init=random"});
    args.insert(args.end(), extra.begin(), extra.end());
    const Ran ran = run_ranks(ranks, args, dir, name + ".txt");
    REQUIRE_MESSAGE(ran.exit_code == 0, ran.output);
    return ran;
  };
  job("one", 0, 4, {});
  job("tensor4", 4, 4, {"--set", "parallel.tensor=4"});
  check_equals_one_process(dir, "one", "tensor4");
  const Ran both = job("data2_tensor2", 4, 2, {"--set", "parallel.tensor=2"});
  CHECK(both.output.find("x 2 ranks (data parallel)") != std::string::npos);
  check_equals_one_process(dir, "one", "data2_tensor2");
  // One process and tensor 4, both with `extra`.
  auto check_tensor4 = [&](const std::string& name, const std::vector<std::string>& extra) {
    std::vector<std::string> split = extra;
    split.insert(split.end(), {"--set", "parallel.tensor=4"});
    job("one_" + name, 0, 4, extra);
    job("tensor4_" + name, 4, 4, split);
    check_equals_one_process(dir, "one_" + name, "tensor4_" + name);
  };
  check_tensor4("nf4", {"--set", "quantization.mode=nf4"});
  // Two key/value heads over 4 ranks: each on 2 of them.
  check_tensor4("gqa", {"--set", "model=" + std::string(FT_FIXTURES_DIR) + "/tensor_parallel_gqa"});
  // GPT-NeoX: query_key_value's per-head rows and the parallel residual.
  check_tensor4("neox", {"--set", "model=" + std::string(FT_FIXTURES_DIR) + "/tensor_parallel_neox"});

  // Beside pipeline stages: 2 stages of 1 layer, each split over 2 ranks.
  // Stages load their layers from a checkpoint: the fixture's random weights saved as one.
  const std::string pretrained = dir + "/pretrained";
  fs::create_directories(pretrained);
  fs::copy_file(std::string(FT_FIXTURES_DIR) + "/tensor_parallel/config.json", pretrained + "/config.json");
  {
    HostAllocator host;
    CpuBackend backend(host);
    std::unique_ptr<LanguageModel> model =
        make_language_model(read_model_config(pretrained + "/config.json"), backend, ModelOptions{});
    model->init_random(5);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (Parameter& p : model->parameters()) tensors.emplace_back(p.name, p.value);
    save_safetensors(pretrained + "/model.safetensors", tensors);
  }
  const std::vector<std::string> from_checkpoint = {"--set", "model=" + pretrained, "--set", "init=pretrained"};
  std::vector<std::string> staged = from_checkpoint;
  staged.insert(staged.end(), {"--set", "parallel.tensor=2", "--set", "parallel.pipeline=2"});
  job("one_pretrained", 0, 4, from_checkpoint);
  const Ran pipeline = job("pipeline2_tensor2", 4, 4, staged);
  CHECK(pipeline.output.find("through 2 pipeline stages, each layer split over 2 tensor-parallel ranks") !=
        std::string::npos);
  check_equals_one_process(dir, "one_pretrained", "pipeline2_tensor2");
}

TEST_CASE("tensor parallel: kill -9 of one rank ends the job; --resume on 2 ranks ends with the uninterrupted "
          "adapter" * doctest::skip()) {
  skip_without_mpirun();
  std::vector<std::string> extra = kTensorLora;
  extra.insert(extra.end(), {"--set", "parallel.tensor=2"});
  check_kill_and_resume((fs::path(FT_BINARY_DIR) / "cli_runs" / "tensor_parallel_kill").string(), extra,
                        "parallel.tensor: the checkpoint's: 2; none in this run");
}

namespace {

// A folder training the shipped tiny T5 architecture (configs/tiny-t5, random
// weights) on summaries: prompt/completion rows of different lengths, so every
// batch pads its encoder rows.
std::string make_t5_run_dir(const std::string& name, const std::string& extra_yaml) {
  const fs::path dir = fresh_run_dir(name, "summarize_train.jsonl", 32, 8);
  const std::string configs = std::string(FT_SOURCE_DIR) + "/configs";
  std::ofstream(dir / "config.yaml") << "model: " << configs << "/tiny-t5\n"
                                     << "tokenizer: " << configs << "/tiny-base/tokenizer.model\n"
                                     << "init: random\n"
                                     << "data: {train: train.jsonl, eval: eval.jsonl, add_eos: true}\n"
                                     << "seq_len: 128\nmicro_batch_size: 4\ngrad_accum_steps: 2\n"
                                     << "lr: 1.0e-3\nmax_steps: 4\nsave_every: 2\neval_batches: 1\n"
                                     << "task_metric: rouge\nmetric_examples: 2\n"
                                     << "generate: {max_new_tokens: 4, num_samples: 1}\noutput_dir: out\n"
                                     << extra_yaml;
  return dir.string();
}

}  // namespace

TEST_CASE("t5 trains through finetune: LoRA on q and v (PEFT's T5 adapter), INT8 base, full fine-tuning, resume") {
  // LoRA over an INT8 base: the adapter is PEFT's, under T5's module names.
  // A constant schedule, so a run stopped after step 2 continues as the whole run: the same losses.
  const std::string run_yaml = "quantization: {mode: int8}\nlora: {r: 4, lora_alpha: 8}\nschedule: constant\n";
  const std::string lora = make_t5_run_dir("t5_lora", run_yaml);
  CommandResult result = run_command("cd " + lora + " && " + kBinary + " config.yaml");
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  // q and v in 3 encoder self-attentions, 3 decoder self- and 3 cross-attentions: 9 x 2 x 4 x (128 + 128).
  CHECK(result.output.find("trainable params: 18,432 ||") != std::string::npos);
  CHECK(result.output.find("| rouge1 ") != std::string::npos);
  const nlohmann::json adapter_config = nlohmann::json::parse(read_file(lora + "/out/adapter/adapter_config.json"));
  CHECK(adapter_config["task_type"] == "SEQ_2_SEQ_LM");
  CHECK(adapter_config["target_modules"] == nlohmann::json::array({"q", "v"}));
  const Checkpoint adapter(lora + "/out/adapter/adapter_model.safetensors");
  CHECK(adapter.contains("base_model.model.decoder.block.1.layer.1.EncDecAttention.q.lora_A.weight"));
  CHECK(adapter.contains("base_model.model.encoder.block.2.layer.0.SelfAttention.v.lora_B.weight"));
  const auto losses = train_losses(lora + "/out/metrics.jsonl");
  REQUIRE(losses.size() == 4);

  const std::string resumed = make_t5_run_dir("t5_resumed", run_yaml);
  REQUIRE(run_command("cd " + resumed + " && " + kBinary + " config.yaml --set max_steps=2").exit_code == 0);
  CommandResult again = run_command("cd " + resumed + " && " + kBinary + " config.yaml --resume");
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  CHECK(train_losses(resumed + "/out/metrics.jsonl") == losses);

  // Full fine-tuning writes the whole model in HF layout.
  const std::string full = make_t5_run_dir("t5_full", "trainable: all\nquantization: {mode: none}\n");
  result = run_command("cd " + full + " && " + kBinary + " config.yaml --set max_steps=2");
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  CHECK(result.output.find("trainable params: 1,739,136 || all params: 1,739,136 || trainable%: 100.0000") !=
        std::string::npos);
  CHECK(fs::exists(full + "/out/model/model.safetensors"));
  CHECK(fs::exists(full + "/out/model/config.json"));
}

TEST_CASE("t5 refuses packing and objective: dpo with the file and field named") {
  const std::string dir = make_t5_run_dir("t5_bad", "");
  CommandResult packed = run_command("cd " + dir + " && " + kBinary + " config.yaml --set data.packing=true");
  CHECK(packed.exit_code == 1);
  CHECK(packed.output.find("config.yaml: data.packing: padding_free packs examples into causal rows") !=
        std::string::npos);
  CommandResult dpo = run_command("cd " + dir + " && " + kBinary +
                                  " config.yaml --set objective=dpo --set task_metric=none");
  CHECK(dpo.exit_code == 1);
  CHECK(dpo.output.find("objective: dpo needs a decoder-only model") != std::string::npos);
}

TEST_CASE("configs/course-lab2.yaml runs its four-way comparison (short) and writes the table and the chart") {
  const fs::path out = fs::path(FT_BINARY_DIR) / "cli_runs" / "course_lab2";
  fs::remove_all(out);
  CommandResult result = run_command(kBinary + " " + FT_SOURCE_DIR + "/configs/course-lab2.yaml --set max_steps=2" +
                                     " --set metric_examples=2 --set eval_batches=1 --set output_dir=" + out.string());
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  const size_t table = result.output.find("method ");
  REQUIRE(table != std::string::npos);
  for (const char* row : {"original model", "full fine-tuning", "LoRA", "INT8 + LoRA"})
    CHECK(result.output.find(std::string("\n") + row + " ", table) != std::string::npos);
  // LoRA r=32 on q and v: 9 attentions x 2 x 32 x (128 + 128); the original trains nothing.
  CHECK(result.output.find("147,456 / 1,886,592 (7.82%)", table) != std::string::npos);
  CHECK(result.output.find("0 / 1,739,136 (0.00%)", table) != std::string::npos);
  // The original model is evaluated as built: no gradient or AdamW buffers (full fine-tuning's 6.6 MiB and 13.3).
  const size_t original = result.output.find("=== original model (evaluated, not trained)");
  REQUIRE(original != std::string::npos);
  CHECK(result.output.find("trainable params: 0 ||", original) < result.output.find("=== full", original));
  CHECK(result.output.find("gradients 0 B, optimizer 0 B", original) < result.output.find("=== full", original));
  std::istringstream csv(read_file((out / "comparison.csv").string()));
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(csv, line)) lines.push_back(line);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0].rfind("method,rouge1,rouge2,rougeL,rougeLsum,", 0) == 0);
  CHECK(lines[4].rfind("INT8 + LoRA,", 0) == 0);
  CHECK(read_file((out / "rouge.svg").string()).find("<rect class=\"bar\"") != std::string::npos);
  CHECK(fs::exists(out / "lora" / "adapter" / "adapter_config.json"));
}

TEST_CASE("a comparison file's bad entries exit 1 naming the file, line and field") {
  const fs::path dir = fs::path(FT_BINARY_DIR) / "cli_runs" / "compare_bad";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string configs = std::string(FT_SOURCE_DIR) + "/configs";
  const std::string shared = "model: " + configs + "/tiny-t5\ntokenizer: " + configs +
                             "/tiny-base/tokenizer.model\ndata: {train: " + configs +
                             "/data/summarize_train.jsonl, eval: " + configs +
                             "/data/summarize_eval.jsonl}\ntask_metric: rouge\n";
  struct Case {
    std::string compare, expected;
  };
  const Case cases[] = {
      {"compare: []\n", "bad.yaml: compare: expected a list of runs"},
      {"compare:\n  - {train: false}\n", "bad.yaml:6: compare[0].name: expected a name"},
      {"compare:\n  - {name: a}\n  - {name: b, lora: {r: 0}}\n", "bad.yaml:7: lora.r"},
      {"compare:\n  - {name: a, train: maybe}\n", "bad.yaml:6: compare[0].train: expected true or false"},
      {"compare:\n  - {name: a, output_dir: x}\n", "compare[0].output_dir: runs write to the file's output_dir"},
      {"compare:\n  - {name: LoRA}\n  - {name: lora}\n", "compare[1].name: \"lora\" names the same folder"},
      {"compare:\n  - {name: a, task_metric: none}\n", "compare[0]: task_metric: rouge (and data.eval) is needed"},
      {"compare:\n  - {name: a, compare: [{name: b, lr: fast}]}\n",
       "bad.yaml:6: compare[0].compare: a run cannot hold a comparison of its own"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.compare);
    std::ofstream(dir / "bad.yaml") << shared << c.compare;
    CommandResult result = run_command("cd " + dir.string() + " && " + kBinary + " bad.yaml");
    CHECK(result.exit_code == 1);
    CHECK_MESSAGE(result.output.find(c.expected) != std::string::npos, result.output);
  }
}

TEST_CASE("finetune course runs from any directory: it finds the configs it ships") {
  const CommandResult result = run_command("cd / && " + kBinary + " course");
  CHECK(result.exit_code == 0);
  CHECK(result.output.find("The course's memory and LoRA figures") != std::string::npos);
  CHECK(result.output.find(std::string(FT_SOURCE_DIR) + "/configs") != std::string::npos);
}

TEST_CASE("generate --chat gives the template tools: a --file row's own, or --tools; a tool's result is replied to") {
  // The tiny Qwen2 checkpoint with Qwen2.5's released template (which writes the tool schemas into the system
  // turn), asked the fixtures' weather question after the tool's result came back.
  const fs::path dir = fs::path(FT_BINARY_DIR) / "cli_runs" / "generate_tools";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(kFixtures + "/qwen2_tiny", dir / "model", fs::copy_options::recursive);
  const nlohmann::ordered_json qwen25 =
      nlohmann::ordered_json::parse(read_file(kFixtures + "/chat/qwen2_5/tokenizer_config.json"));
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(read_file((dir / "model/tokenizer_config.json").string()));
  config["chat_template"] = qwen25["chat_template"];
  std::ofstream(dir / "model/tokenizer_config.json") << config.dump();
  // The fixture's first conversation with tools (a call, its result, the reply).
  const nlohmann::ordered_json cases = nlohmann::ordered_json::parse(read_file(kFixtures + "/chat/qwen2_5/cases.json"));
  nlohmann::ordered_json c;
  for (const nlohmann::ordered_json& with : cases["cases"])
    if (c.is_null() && with.contains("tools")) c = with;
  REQUIRE(!c.is_null());
  nlohmann::ordered_json messages = c["messages"];
  messages.erase(messages.end() - 1);  // up to the tool's result
  std::ofstream(dir / "with_tools.jsonl") << nlohmann::ordered_json{{"messages", messages}, {"tools", c["tools"]}}.dump()
                                          << "\n";
  std::ofstream(dir / "plain.jsonl") << nlohmann::ordered_json{{"messages", messages}}.dump() << "\n";
  std::ofstream(dir / "tools.json") << c["tools"].dump();
  const std::string generate = kBinary + " generate " + (dir / "model").string() +
                               " --device cpu --max-new-tokens 8 --chat --file " + dir.string();
  const auto completion = [&](const std::string& args) {
    const CommandResult result = run_command(generate + args + " 2>/dev/null");
    INFO(result.output);
    REQUIRE(result.exit_code == 0);
    return nlohmann::json::parse(result.output);
  };
  const nlohmann::json own = completion("/with_tools.jsonl");
  CHECK(own["tools"] == nlohmann::json(c["tools"]));  // the row echoed, its tools with it
  CHECK(completion("/plain.jsonl --tools " + (dir / "tools.json").string())["completion"] == own["completion"]);
  CHECK(completion("/plain.jsonl")["completion"] != own["completion"]);  // without tools the model sees another prompt
  // One error each: --tools without --chat, a tools file that is not a list, a row with nothing to reply to.
  std::ofstream(dir / "bad_tools.json") << "{\"name\": \"f\"}";
  const CommandResult not_list = run_command(generate + "/plain.jsonl --tools " + (dir / "bad_tools.json").string());
  CHECK(not_list.exit_code == 1);
  CHECK(not_list.output.find((dir / "bad_tools.json").string() +
                             ": expected a JSON list of tool schemas (objects), got {\"name\":\"f\"}") != std::string::npos);
  std::ofstream(dir / "answered.jsonl") << nlohmann::ordered_json{{"messages", c["messages"]}, {"tools", c["tools"]}}.dump()
                                        << "\n";
  const CommandResult answered = run_command(generate + "/answered.jsonl");
  CHECK(answered.exit_code == 1);
  CHECK(answered.output.find("answered.jsonl:1: the last message is the assistant's (expected a user message or a "
                             "tool's result to reply to)") != std::string::npos);
}

namespace {

// The end-of-run samples come with the `finetune generate` command that
// gives them again from what the run saved (the same prompts, batching,
// base and stops): its greedy completions are the printed ones.
void check_samples_again(const std::string& dir, const std::string& run_output, size_t samples) {
  std::vector<std::string> greedy;
  std::istringstream lines(run_output);
  std::string line, command;
  const std::string again = "the samples again, from what this run saves: finetune ";
  while (std::getline(lines, line)) {
    if (line.starts_with("  greedy:    ")) greedy.push_back(line.substr(13));
    if (line.starts_with(again)) command = line.substr(again.size());
  }
  REQUIRE(greedy.size() == samples);
  REQUIRE(!command.empty());
  command = command.substr(0, command.find(" (sampled:"));
  CHECK(fs::exists(dir + "/out/sample_prompts.jsonl"));
  const CommandResult generated = run_command("cd " + dir + " && " + kBinary + " " + command + " 2>/dev/null");
  REQUIRE(generated.exit_code == 0);
  std::istringstream rows(generated.output);
  for (const std::string& want : greedy) {
    REQUIRE(std::getline(rows, line));
    CHECK(nlohmann::json::parse(line)["completion"].get<std::string>() == want);
  }
}

}  // namespace

// warmup_steps below 1 is transformers 5's ratio of the run's steps,
// rounded up: 0.3 of 5 steps warms up over 2 (lr / 2, then lr).
TEST_CASE("warmup_steps: 0.3 warms up over ceil(0.3 x the run's steps)") {
  const std::string dir = make_run_dir("warmup_ratio");
  const CommandResult run = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=5" +
                                        " --set grad_accum_steps=1 --set warmup_steps=0.3 --set schedule=constant");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const std::map<int64_t, double> lr = step_metric(dir + "/out/metrics.jsonl", "lr");
  REQUIRE(lr.size() == 5);
  CHECK(lr.at(1) == doctest::Approx(0.5e-3));
  CHECK(lr.at(2) == doctest::Approx(1.0e-3));
  CHECK(lr.at(5) == doctest::Approx(1.0e-3));
}

// data.completion_only_loss: false reaches the run's rows: the default
// config's summaries then train on their prompts too (tests/test_data.cpp
// checks the tokens against trl's), and a T5, whose encoder reads the
// prompt, refuses it.
TEST_CASE("data.completion_only_loss: false trains a run on the prompts too; a T5 refuses it") {
  const std::string run = kBinary + " " + FT_SOURCE_DIR + "/configs/default.yaml --set max_steps=1 --set eval_batches=1" +
                          " --set generate.num_samples=0 --set task_metric=none --overwrite --set output_dir=" +
                          FT_BINARY_DIR + "/cli_runs/completion_only_loss";
  const CommandResult completion = run_command(run);
  const CommandResult every = run_command(run + " --set data.completion_only_loss=false");
  INFO(completion.output, every.output);
  REQUIRE(completion.exit_code == 0);
  REQUIRE(every.exit_code == 0);
  const auto loss_tokens = [](const std::string& output) {
    const size_t at = output.find("train: 4000 examples, ");
    return at == std::string::npos ? int64_t(-1) : std::stoll(output.substr(at + 22));
  };
  CHECK(loss_tokens(completion.output) > 0);
  CHECK(loss_tokens(every.output) > 3 * loss_tokens(completion.output));  // the prompts are the longer part
  const CommandResult t5 = run_command(kBinary + " " + FT_SOURCE_DIR + "/configs/course-lab2.yaml --set " +
                                       "data.completion_only_loss=false --set output_dir=" + FT_BINARY_DIR +
                                       "/cli_runs/completion_only_loss_t5");
  CHECK(t5.exit_code == 1);
  CHECK(t5.output.find("course-lab2.yaml: data.completion_only_loss: false trains on the prompt's tokens too, which "
                       "a t5 model's encoder reads") != std::string::npos);
}

// A base saved quantised (quantization.save_base writes what transformers +
// bitsandbytes write: config.json's quantization_config) loads in its own
// format, as transformers' from_pretrained loads it: generate takes that
// format without --quantization and refuses another, naming the option. The
// adapter's record keeps NF4's double_quant, so generate over the original
// base quantises it as training did.
TEST_CASE("generate takes a saved quantised base's format; the adapter record keeps NF4's double_quant") {
  const std::string dir = make_run_dir("stored_nf4", "quantization: {mode: nf4, double_quant: false, save_base: base}\n");
  const CommandResult trained = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=1");
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  const nlohmann::json record = nlohmann::json::parse(std::ifstream(dir + "/out/adapter/finetune_run.json"));
  CHECK(record["base_quantization"] == "nf4");
  CHECK(record["double_quant"] == false);
  const std::string generate = "cd " + dir + " && " + kBinary + " generate ";
  const std::string prompt = " --device cpu --max-new-tokens 2 --prompt 'The weather'";
  const CommandResult stored = run_command(generate + "base" + prompt);
  INFO(stored.output);
  CHECK(stored.exit_code == 0);
  CHECK(stored.output.find("base: nf4, double_quant false, precision fp32 (the base as stored: base/config.json's "
                           "quantization_config)") != std::string::npos);
  const CommandResult other = run_command(generate + "base" + prompt + " --quantization int8");
  CHECK(other.exit_code == 1);
  CHECK(other.output.find("error: base/config.json: quantization_config: the base's decoder linears are stored NF4 "
                          "and load only with --quantization nf4, not int8\n") != std::string::npos);
  const CommandResult adapter = run_command(generate + kFixtures + "/llama_gqa --adapter out/adapter --tokenizer " +
                                            kFixtures + "/tokenizer/tokenizer.model" + prompt);
  INFO(adapter.output);
  CHECK(adapter.exit_code == 0);
  CHECK(adapter.output.find("base: nf4, double_quant false, precision fp32 (as the adapter was trained") !=
        std::string::npos);
}

// A user's chat path: conversations whose assistant always replies
// "Sure, here it is." train an adapter (Llama-2's template over the fixture
// tokenizer); the adapter folder records how (finetune_run.json), so
// `generate --chat` renders a held-out question as training rendered its
// rows, over the base the adapter was trained on, and replies in the trained
// format; without --chat, generate says the adapter wants it.
TEST_CASE("generate --chat replies in the chat-trained format; without --chat it says to add it") {
  const std::string dir = make_run_dir("chat_generate");
  std::ifstream source(std::string(FT_SOURCE_DIR) + "/configs/data/pretrain.jsonl");
  std::ofstream train(dir + "/train.jsonl"), eval(dir + "/eval.jsonl");
  std::string line;
  for (int i = 0; i < 200 && std::getline(source, line); ++i) {
    const std::string text = nlohmann::json::parse(line)["text"];
    const nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", text.substr(0, text.find(' ', 20))}},
                                                           {{"role", "assistant"}, {"content", "Sure, here it is."}}});
    (i < 180 ? train : eval) << nlohmann::json{{"messages", messages}}.dump() << "\n";
  }
  train.close(), eval.close();
  const CommandResult trained = run_command(
      "cd " + dir + " && " + kBinary +
      " config.yaml --set data.chat_template=llama2 --set max_steps=40 --set grad_accum_steps=1 --set lr=2.0e-2"
      " --set lora.target_modules=all-linear --set lora.r=8 --set lora.lora_dropout=0 --set task_metric=none"
      " --set generate.num_samples=1 --set generate.temperature=0 --set eval_batches=0");
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  CHECK(trained.output.find("chat template: llama2 (data.chat_template)") != std::string::npos);
  // The sample's prompt as the model sees it, its bos included; at temperature 0 no separate sampled line.
  CHECK(trained.output.find("--- sample 1 ---\n<s>[INST] ") != std::string::npos);
  CHECK(trained.output.find("sampled (temperature") == std::string::npos);
  check_samples_again(dir, trained.output, 1);  // the rows' conversations, through generate --chat
  const nlohmann::json record = nlohmann::json::parse(std::ifstream(dir + "/out/adapter/finetune_run.json"));
  CHECK(record["chat_template"] == "llama2");
  CHECK(record["base_quantization"] == "int8");

  const std::string generate = "cd " + dir + " && " + kBinary + " generate " + kFixtures + "/llama_gqa --adapter " +
                               "out/adapter --tokenizer " + kFixtures + "/tokenizer/tokenizer.model --device cpu " +
                               "--max-new-tokens 12 --prompt 'What did Person2 say about the weather'";
  const CommandResult chat = run_command(generate + " --chat");
  INFO(chat.output);
  CHECK(chat.exit_code == 0);
  CHECK(chat.output.find("base: int8, precision fp32 (as the adapter was trained") != std::string::npos);
  // --quantization overrides the record's base; the line says which of the two the record set.
  const CommandResult dense = run_command(generate + " --chat --quantization none");
  CHECK(dense.exit_code == 0);
  CHECK(dense.output.find("base: none, precision fp32 (precision as the adapter was trained") != std::string::npos);
  CHECK(chat.output.find("chat template: llama2") != std::string::npos);
  CHECK(chat.output.find("Sure, here it is.") != std::string::npos);
  const CommandResult bare = run_command(generate);
  CHECK(bare.exit_code == 0);
  CHECK(bare.output.find("the adapter was trained on chat rows (template llama2): add --chat") != std::string::npos);
  CHECK(run_command(generate + " --system 'Be brief.'").output.find("--system, --chat-template and --tools apply to --chat") !=
        std::string::npos);

  // --file in chat mode: {"messages"} rows answered as a conversation; a row that does not end with a user
  // message, or a role the template cannot take, is one error naming the file and the line.
  std::ofstream(dir + "/chats.jsonl")
      << R"({"messages": [{"role": "user", "content": "What did Person1 ask"}]})" << "\n"
      << R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})" << "\n";
  const std::string file = "cd " + dir + " && " + kBinary + " generate " + kFixtures + "/llama_gqa --adapter out/adapter " +
                           "--tokenizer " + kFixtures + "/tokenizer/tokenizer.model --device cpu --chat --file ";
  const CommandResult bad_row = run_command(file + "chats.jsonl");
  CHECK(bad_row.exit_code == 1);
  CHECK(bad_row.output.find("chats.jsonl:2: the last message is the assistant's (expected a user message to reply "
                            "to)") != std::string::npos);
  std::ofstream(dir + "/chats.jsonl", std::ios::trunc)
      << R"({"messages": [{"role": "user", "content": "What did Person1 ask"}]})" << "\n"
      << R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Again"}]})" << "\n";
  const CommandResult bad_roles = run_command(file + "chats.jsonl");
  CHECK(bad_roles.exit_code == 1);
  CHECK(bad_roles.output.find("chats.jsonl:2: the built-in llama2 chat template line 1: the template raised an "
                              "exception: Conversation roles must alternate user/assistant/user/assistant/...") !=
        std::string::npos);
  std::ofstream(dir + "/chats.jsonl", std::ios::trunc)
      << R"({"messages": [{"role": "user", "content": "What did Person1 ask"}]})" << "\n";
  const CommandResult answered = run_command(file + "chats.jsonl 2>/dev/null");
  CHECK(answered.exit_code == 0);
  CHECK(nlohmann::json::parse(answered.output)["completion"] == "Sure, here it is.");

  // A record that lost a field says which.
  std::ofstream(dir + "/out/adapter/finetune_run.json", std::ios::trunc) << "{}\n";
  const CommandResult no_record = run_command(generate);
  CHECK(no_record.exit_code == 1);
  CHECK(no_record.output.find("out/adapter/finetune_run.json: missing \"base_quantization\" (one of ") !=
        std::string::npos);
}

TEST_CASE("epochs: whole steps, and a run says when an epoch's last step reaches into the next epoch") {
  const std::string dir = make_run_dir("epochs");
  const std::string run = "cd " + dir + " && " + kBinary + " config.yaml --set max_steps=0 --set epochs=1 " +
                          "--set data.packing=false --set micro_batch_size=40 --set generate.num_samples=0 " +
                          "--set eval_batches=0 --set grad_accum_steps=";
  // 240 rows are 6 micro-batches: 4 a step make 2 steps, the second with 2 of the next epoch's shuffle.
  const CommandResult uneven = run_command(run + "4");
  INFO(uneven.output);
  REQUIRE(uneven.exit_code == 0);
  CHECK(uneven.output.find("warning: an epoch is 6 micro-batches and a step takes 4: each epoch's last step also "
                           "takes 2 from the next epoch's shuffle, so epochs: 1 trains 2 x 4 micro-batches") !=
        std::string::npos);
  const CommandResult even = run_command(run + "3 --overwrite");
  INFO(even.output);
  REQUIRE(even.exit_code == 0);
  CHECK(even.output.find("warning: an epoch is") == std::string::npos);
  CHECK(even.output.find("training 2 steps of 40 x 3 sequences") != std::string::npos);
}

TEST_CASE("the end-of-run samples are reproduced by the generate command the run prints") {
  const std::string dir = make_run_dir("samples_again");
  const CommandResult trained =
      run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=4 --set generate.num_samples=3 " +
                  "--set generate.max_new_tokens=6 --set task_metric=none");
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  check_samples_again(dir, trained.output, 3);
}

// The memory options end to end through the binary, each on the CPU: an NF4
// base, AdamW's state in host memory, the base streamed through device slots
// (on the CPU a memcpy, the same code path), and full fine-tuning whose saved
// model folder loads again (generate reads it). Each trains, its loss falls
// and its outputs are written.
TEST_CASE("nf4, both offloads and full fine-tuning train through the binary; the full model loads back") {
  const std::string dir = make_run_dir("memory_options");
  struct Case {
    const char* name;
    std::string settings;
    const char* output;
  };
  const Case cases[] = {
      {"nf4", " --set quantization.mode=nf4", "adapter/adapter_model.safetensors"},
      {"optimizer_host", " --set offload.optimizer=host", "adapter/adapter_model.safetensors"},
      {"base_host", " --set quantization.mode=nf4 --set offload.base=host --set activation_checkpointing=per_layer",
       "adapter/adapter_model.safetensors"},
      // bf16 weights from the f32 fixture: the saved config.json must say so.
      {"full", " --set trainable=all --set quantization.mode=none --set precision=bf16", "model/model.safetensors"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string out = std::string("out_") + c.name;
    const CommandResult result = run_command("cd " + dir + " && " + kBinary + " config.yaml --set max_steps=6" +
                                             " --set grad_accum_steps=1 --set lr=1.0e-2 --set output_dir=" + out +
                                             c.settings);
    INFO(result.output);
    REQUIRE(result.exit_code == 0);
    const auto losses = train_losses(dir + "/" + out + "/metrics.jsonl");
    REQUIRE(losses.size() == 6);
    CHECK(losses.rbegin()->second < losses.begin()->second);
    CHECK(fs::exists(dir + "/" + out + "/" + c.output));
  }
  // config.json names the dtype the weights were saved in, which transformers loads them in.
  const nlohmann::json saved_config = nlohmann::json::parse(std::ifstream(dir + "/out_full/model/config.json"));
  CHECK(saved_config["dtype"] == "bfloat16");
  CHECK(Checkpoint(dir + "/out_full/model").entry("model.embed_tokens.weight").dtype == DType::bf16);
  const CommandResult reloaded =
      run_command(kBinary + " generate " + dir + "/out_full/model --device cpu --prompt 'The cat' --max-new-tokens 4");
  INFO(reloaded.output);
  CHECK(reloaded.exit_code == 0);
  CHECK(reloaded.output.find("generate: ") != std::string::npos);
}

namespace {

// {name: {"dtype", "shape"}} of a .safetensors file's tensors.
nlohmann::json safetensors_tensors(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  uint64_t header_bytes = 0;
  const nlohmann::json header = safetensors_header(file, header_bytes);
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& item : header.items())
    if (item.key() != "__metadata__")
      tensors[item.key()] = {{"dtype", item.value()["dtype"]}, {"shape", item.value()["shape"]}};
  return tensors;
}

// The f32 logits [T, vocab] of the model folder on input_ids [1, T].
Tensor folder_logits(const std::string& folder, const Tensor& input_ids, HostAllocator& host, CpuBackend& backend) {
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.quantized_base = QuantizedBase::none;
  std::unique_ptr<CausalLM> model = make_causal_lm(read_model_config(folder + "/config.json"), backend, options);
  model->load(Checkpoint(folder));
  std::vector<int32_t> targets(size_t(input_ids.numel()), -100);
  model->forward(input_ids, Tensor::view_of(targets.data(), input_ids.shape, DType::i32));
  Tensor logits = Tensor::empty(model->last_logits().shape, DType::f32, host, MemCategory::workspace);
  backend.copy(logits, model->last_logits());
  return logits;
}

}  // namespace

// Full fine-tuning of a decoder as a user takes it away: the saved model folder
// holds exactly the tensors transformers writes for this model (names, dtypes,
// shapes), the base's config.json and the tokenizer, and our logits of it equal
// transformers' logits of the folder the same run saved
// (scripts/make_full_finetune_fixture.py loads it with
// AutoModelForCausalLM.from_pretrained). The base's logits are far outside the
// tolerance, so a folder of untrained weights fails.
TEST_CASE("full fine-tuning saves a model folder transformers loads, with transformers' logits") {
  const std::string fixture = kFixtures + "/full_finetune";
  const fs::path dir = fs::path(FT_BINARY_DIR) / "cli_runs" / "full_finetune";
  fs::remove_all(dir);
  const CommandResult result =
      run_command(kBinary + " " + fixture + "/config.yaml --set output_dir=" + (dir / "out").string());
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  const std::string folder = (dir / "out" / "model").string();
  CHECK(safetensors_tensors(folder + "/model.safetensors") ==
        nlohmann::json::parse(std::ifstream(fixture + "/tensors.json")));
  CHECK(read_file(folder + "/config.json") == read_file(kFixtures + "/llama_gqa/config.json"));
  CHECK(read_file(folder + "/tokenizer.model") == read_file(kFixtures + "/tokenizer/tokenizer.model"));

  HostAllocator host;
  CpuBackend backend(host);
  Checkpoint reference(fixture + "/reference.safetensors");
  const Tensor input_ids = reference.view("input_ids"), want = reference.view("logits");
  // Measured 7e-7; the sanitizer build, whose rounding differs, 1e-6 (a few
  // weights with gradients near 0 get other Adam steps). The base is 0.59 away.
  const double tolerance = 1e-5;
  CHECK(parity::relative_error(folder_logits(folder, input_ids, host, backend), want) <= tolerance);
  CHECK(parity::relative_error(folder_logits(kFixtures + "/llama_gqa", input_ids, host, backend), want) >
        1000 * tolerance);
}

TEST_CASE("objective: reward: the adapter's scores equal its merged sequence classifier's; no score head is refused") {
  const fs::path dir = fresh_run_dir("reward", "preference_train.jsonl", 16, 4);
  // The default model: its context fits the preference rows.
  const std::string model = std::string(FT_SOURCE_DIR) + "/configs/tiny-base";
  std::ofstream(dir / "config.yaml") << "model: " << model << "\n"
                                     << "objective: reward\nquantization: {mode: none}\n"
                                     << "data: {train: train.jsonl, eval: eval.jsonl}\n"
                                     << "seq_len: 256\nmicro_batch_size: 4\nlora: {r: 4, lora_alpha: 8}\n"
                                     << "lr: 1.0e-3\nmax_steps: 3\noutput_dir: out\n";
  const std::string in_dir = "cd " + dir.string() + " && ";
  const CommandResult run = run_command(in_dir + kBinary + " config.yaml");
  REQUIRE_MESSAGE(run.exit_code == 0, run.output);
  CHECK(run.output.find("eval accuracy (held-out pairs)") != std::string::npos);
  CHECK(read_file((dir / "out/adapter/adapter_config.json").string()).find("\"SEQ_CLS\"") != std::string::npos);
  // No samples: a reward model's language-model head is not what it trained (nor would generate load its adapter).
  CHECK(run.output.find("--- sample 1 ---") == std::string::npos);
  CHECK(run.output.find("the samples again") == std::string::npos);

  std::ofstream(dir / "rows.jsonl") << "{\"prompt\": \"A dialogue.\", \"completion\": \"A summary.\"}\n"
                                    << "{\"text\": \"Only text, scored whole.\"}\n";
  const CommandResult adapter =
      run_command(in_dir + kBinary + " score " + model + " --adapter out/adapter --file rows.jsonl 2>/dev/null");
  REQUIRE_MESSAGE(adapter.exit_code == 0, adapter.output);
  REQUIRE(run_command(in_dir + kBinary + " merge " + model + " --adapter out/adapter --out merged")
              .exit_code == 0);
  const CommandResult merged =
      run_command(in_dir + kBinary + " score merged --file rows.jsonl 2>/dev/null");
  REQUIRE_MESSAGE(merged.exit_code == 0, merged.output);
  auto scores = [](const std::string& output) {
    std::vector<double> values;
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);) values.push_back(nlohmann::json::parse(line)["score"].get<double>());
    return values;
  };
  const std::vector<double> from_adapter = scores(adapter.output), from_merged = scores(merged.output);
  REQUIRE(from_adapter.size() == 2);
  REQUIRE(from_merged.size() == 2);
  for (size_t i = 0; i < 2; ++i) CHECK(std::abs(from_adapter[i] - from_merged[i]) <= 1e-5 * std::max(1.0, std::abs(from_adapter[i])));
  CHECK(read_file((dir / "merged/config.json").string()).find("LlamaForSequenceClassification") != std::string::npos);
  // A sequence classifier is no GGUF language model: said, nothing written.
  const CommandResult gguf = run_command(in_dir + kBinary + " export merged --gguf merged.gguf");
  CHECK(gguf.exit_code == 1);
  CHECK(gguf.output.find("merged: holds \"score.weight\", a sequence classifier's score head") != std::string::npos);
  CHECK(!fs::exists(dir / "merged.gguf"));
  // Nor a model to generate with (its language-model head is not written: transformers' classifier has none).
  const CommandResult generated = run_command(in_dir + kBinary + " generate merged --prompt hi --max-new-tokens 2");
  CHECK(generated.exit_code == 1);
  CHECK(generated.output.find("merged: holds \"score.weight\", a sequence classifier's score head (a reward model "
                              "merged by finetune merge): it has no language-model head to generate with") !=
        std::string::npos);

  const CommandResult no_head =
      run_command(in_dir + kBinary + " score " + model + " --file rows.jsonl");
  CHECK(no_head.exit_code == 1);
  CHECK(no_head.output.find("has no score head (score.weight) and no --adapter was given") != std::string::npos);
  // A row holding both forms: which one to score is said to be unclear, with the line.
  std::ofstream(dir / "both.jsonl") << "{\"text\": \"fine\"}\n{\"prompt\": \"A dialogue.\", \"text\": \"Or this.\"}\n";
  const CommandResult both = run_command(in_dir + kBinary + " score merged --file both.jsonl");
  CHECK(both.exit_code == 1);
  CHECK(both.output.find("both.jsonl:2: row has \"text\" and \"prompt\": which to score is unclear") !=
        std::string::npos);
  const CommandResult packed = run_command(in_dir + kBinary + " config.yaml --set data.packing=true");
  CHECK(packed.exit_code == 1);
  CHECK(packed.output.find("objective: reward scores each row's last token") != std::string::npos);

  // Over a base with its own lm_head (llama_gqa, untied), the merged classifier holds the score head and not the
  // language-model head, as transformers' *ForSequenceClassification, and scores as the adapter does.
  std::ofstream(dir / "short.jsonl") << "{\"prompt\": \"a b\", \"chosen\": \" c d\", \"rejected\": \" e\"}\n"
                                     << "{\"prompt\": \"f\", \"chosen\": \" g\", \"rejected\": \" h i\"}\n";
  const std::string untied = kFixtures + "/llama_gqa";
  const std::string tokenizer = " --tokenizer " + kFixtures + "/tokenizer/tokenizer.model";
  REQUIRE(run_command(in_dir + kBinary + " config.yaml --set model=" + untied + " --set tokenizer=" + kFixtures +
                      "/tokenizer/tokenizer.model --set data.train=short.jsonl --set data.eval=short.jsonl" +
                      " --set seq_len=32 --set micro_batch_size=2 --set max_steps=1 --set output_dir=untied")
              .exit_code == 0);
  REQUIRE(run_command(in_dir + kBinary + " merge " + untied + " --adapter untied/adapter --out untied_merged").exit_code ==
          0);
  const Checkpoint merged_untied((dir / "untied_merged").string());
  CHECK(merged_untied.contains("score.weight"));
  CHECK(!merged_untied.contains("lm_head.weight"));
  const CommandResult untied_adapter =
      run_command(in_dir + kBinary + " score " + untied + " --adapter untied/adapter" + tokenizer + " --file rows.jsonl 2>/dev/null");
  const CommandResult untied_merged =
      run_command(in_dir + kBinary + " score untied_merged" + tokenizer + " --file rows.jsonl 2>/dev/null");
  REQUIRE_MESSAGE(untied_merged.exit_code == 0, untied_merged.output);
  const std::vector<double> a = scores(untied_adapter.output), m = scores(untied_merged.output);
  REQUIRE(a.size() == 2);
  REQUIRE(m.size() == 2);
  for (size_t i = 0; i < 2; ++i) CHECK(std::abs(a[i] - m[i]) <= 1e-5 * std::max(1.0, std::abs(a[i])));
}

// objective: ppo on the llama_gqa fixture, on prompts made from the
// pretraining text (40 to train on, 32 held out). Its rewards: by default the
// reward fixture's sequence classifier (tests/fixtures/reward/model:
// llama_gqa's weights under a score head).
fs::path make_ppo_dir(const std::string& name, const std::string& rewards = "") {
  const fs::path dir = fs::path(FT_BINARY_DIR) / "cli_runs" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream source(std::string(FT_SOURCE_DIR) + "/configs/data/pretrain.jsonl");
  std::ofstream train(dir / "train.jsonl"), eval(dir / "eval.jsonl");
  std::string line;
  for (int i = 0; i < 72 && std::getline(source, line); ++i) {
    const std::string text = nlohmann::json::parse(line)["text"].get<std::string>();
    (i < 40 ? train : eval) << nlohmann::json{{"prompt", text.substr(0, 40)}}.dump() << "\n";
  }
  const std::string tokenizer = kFixtures + "/tokenizer/tokenizer.model";
  const std::string reward_model = "{model: " + kFixtures + "/reward/model, model_tokenizer: " + tokenizer + "}";
  std::ofstream(dir / "config.yaml") << "model: " << kFixtures << "/llama_gqa\ntokenizer: " << tokenizer << "\n"
                                     << "objective: ppo\nquantization: {mode: none}\n"
                                     << "ppo: {batch_size: 8, mini_batch_size: 4, ppo_epochs: 2, max_new_tokens: 12,\n"
                                     << "      init_kl_coef: 0.05}\n"
                                     << "rewards: " << (rewards.empty() ? reward_model : rewards) << "\n"
                                     << "data: {train: train.jsonl, eval: eval.jsonl}\n"
                                     << "seq_len: 48\nmicro_batch_size: 8\nlora: {r: 8, lora_alpha: 16}\n"
                                     << "lr: 3.0e-3\nmax_steps: 8\nsave_every: 4\nmetric_examples: 8\n"
                                     << "generate: {num_samples: 0}\noutput_dir: out\n";
  return dir;
}

// The eval_reward and eval_kl rows of a metrics.jsonl, in order.
std::vector<std::pair<double, double>> eval_rewards(const std::string& metrics_path) {
  std::vector<std::pair<double, double>> rows;
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("eval_reward"))
      rows.emplace_back(row["eval_reward"].get<double>(), row["eval_kl"].get<double>());
  }
  return rows;
}

TEST_CASE("objective: ppo raises the held-out reward, its KL below the config's target, and resumes bit for bit") {
  // The learning claim over six seeds (one seed's path turns on rounding: a
  // sanitizer build's arithmetic sent the old single-seed run down instead of
  // up). The reward is the length rule (-|tokens - 4| / 4): sampled 12-token
  // completions score about -2, and a policy that learns to end early scores
  // better on prompts it never saw. 50 steps of 16 rollouts, LoRA on every
  // linear, the value head's dropout at trl's 0.1, ppo.horizon 100 so the
  // adaptive controller steers toward ppo.target 9 within the run. Measured
  // (2-core EPYC, release build), held-out reward over the 32 held-out
  // prompts, seeds 1, 5, 7, 9, 42, 1234: rises 1.54, 1.41, 1.30, 1.38, 1.16,
  // 1.41 (mean 1.37), final KL 5.4 to 6.7 nats. (30 steps: mean 0.58, one
  // seed flat; without the value head's dropout 0.92.)
  // With the reward fixture's random classifier instead, the mean rise is
  // 0.23 and single seeds go either way: a random score is not learnable
  // from 40 prompts, so that pairing only checks resume below.
  constexpr double kTargetKl = 9.0;
  double rise_sum = 0.0;
  const std::vector<int> seeds = {1, 5, 7, 9, 42, 1234};
  for (const int seed : seeds) {
    CAPTURE(seed);
    const fs::path learn = make_ppo_dir("ppo_learn", "{length: 4}");
    const CommandResult run = run_command("cd " + learn.string() + " && " + kBinary +
                                          " config.yaml --set max_steps=50 --set lr=1.0e-2 --set ppo.batch_size=16"
                                          " --set ppo.init_kl_coef=0.01 --set ppo.horizon=100 --set ppo.target=" +
                                          std::to_string(kTargetKl) + " --set metric_examples=32 --set seed=" +
                                          std::to_string(seed) + " --set save_every=0 --set 'lora.target_modules="
                                          "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]'");
    REQUIRE_MESSAGE(run.exit_code == 0, run.output);
    // A step is ppo.batch_size rollouts, not micro_batch_size x grad_accum_steps.
    CHECK(run.output.find("training 50 PPO steps of 16 rollouts (ppo.batch_size), each trained 2 times in "
                          "mini-batches of 4, of up to ") != std::string::npos);
    const auto evals = eval_rewards((learn / "out/metrics.jsonl").string());
    REQUIRE(evals.size() == 2);
    MESSAGE("seed ", seed, ": held-out reward ", evals[0].first, " -> ", evals[1].first, ", KL ", evals[1].second);
    rise_sum += evals[1].first - evals[0].first;
    CHECK(evals[0].second == 0.0);  // before training the policy is the reference
    // The KL the run's config aims the adaptive controller at (ppo.target) bounds it.
    CHECK(evals[1].second < kTargetKl);
    CHECK(fs::exists(learn / "out/value_head.safetensors"));
  }
  CHECK(rise_sum / double(seeds.size()) > 0.7);

  const fs::path dir = make_ppo_dir("ppo");
  REQUIRE(run_command("cd " + dir.string() + " && " + kBinary + " config.yaml").exit_code == 0);

  // Killed after the step-4 checkpoint, resumed: the same adapter, value head
  // and losses (the KL controller's state comes back with the checkpoint).
  const fs::path killed = make_ppo_dir("ppo_killed");
  const int status = signal_when(start_finetune(killed.string(), {"config.yaml"}, "/dev/null"),
                                 [&] { return fs::exists(killed / "out/train_state.safetensors"); }, SIGKILL,
                                 "saving step 4");
  CHECK(WIFSIGNALED(status));
  const CommandResult resumed = run_command("cd " + killed.string() + " && " + kBinary + " config.yaml --resume");
  REQUIRE_MESSAGE(resumed.exit_code == 0, resumed.output);
  CHECK(resumed.output.find("resumed at step 4") != std::string::npos);
  CHECK(read_file((killed / "out/adapter/adapter_model.safetensors").string()) ==
        read_file((dir / "out/adapter/adapter_model.safetensors").string()));
  CHECK(read_file((killed / "out/value_head.safetensors").string()) ==
        read_file((dir / "out/value_head.safetensors").string()));
  CHECK(train_losses((killed / "out/metrics.jsonl").string()) == train_losses((dir / "out/metrics.jsonl").string()));
}

// config.yaml in dir run with each case's arguments: exit status 1, the
// expected message, no adapter written.
struct RefusedRun {
  std::string arguments, expected;
};
void check_refused(const fs::path& dir, const std::vector<RefusedRun>& cases) {
  for (const RefusedRun& c : cases) {
    CAPTURE(c.arguments);
    const CommandResult result = run_command("cd " + dir.string() + " && " + kBinary + " config.yaml " + c.arguments);
    CHECK(result.exit_code == 1);
    CHECK_MESSAGE(result.output.find(c.expected) != std::string::npos, result.output);
    CHECK(!fs::exists(dir / "out/adapter"));
  }
}

// The lab's table row "before" or "after": its five figures (reward mean and
// std, toxicity mean and std, KL), read after the table's header.
std::vector<double> held_out_row(const std::string& output, size_t table, const std::string& phase) {
  const size_t at = output.find("\n" + phase + " ", table);
  REQUIRE_MESSAGE(at != std::string::npos, phase);
  std::istringstream line(output.substr(at + 1 + phase.size(), output.find('\n', at + 1) - at - 1 - phase.size()));
  std::vector<double> values;
  for (double v; line >> v;) values.push_back(v);
  return values;
}

TEST_CASE("configs/course-lab3.yaml as shipped trains the reward classifier, then PPO on the tiny T5 raises its "
          "held-out reward, the KL below ppo.target, and prints the lab's table") {
  // PPO against the trained reward model, as the lab runs it (35-55 s on
  // 2 cores alone; twice that beside other tests, hence three times the
  // usual hang limit). Measured (2-core EPYC, release build): held-out reward
  // 2.2871 -> 2.9152, KL 2.68 (seed 1234, as shipped); the whole config with
  // seeds 1, 7, 42: +0.65, +0.52, +0.90, KL 5.86, 4.86, 3.57. A last-bit
  // change in an op moves these (an earlier build: 2.2871 -> 2.5880).
  constexpr double kTargetKl = 6.0;  // the config's ppo.target
  const fs::path out = fs::path(FT_BINARY_DIR) / "cli_runs" / "course_lab3";
  fs::remove_all(out);
  const std::string adapter = (out / "reward-model" / "adapter").string();
  // The PPO run's rewards.model_adapter, ${output_dir}/reward-model/adapter,
  // follows --set output_dir (no stale adapter from a run elsewhere).
  const CommandResult result =
      run_command(kBinary + " " + FT_SOURCE_DIR + "/configs/course-lab3.yaml --set output_dir=" + out.string(),
                  3 * kRunTimeoutS);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  CHECK(fs::exists(fs::path(adapter) / "adapter_model.safetensors"));
  CHECK(read_file((out / "ppo" / "adapter" / "adapter_config.json").string()).find("\"SEQ_2_SEQ_LM\"") !=
        std::string::npos);
  CHECK(fs::exists(out / "ppo" / "value_head.safetensors"));
  CHECK(result.output.find("reward model: held-out pair accuracy ") != std::string::npos);
  const size_t table = result.output.find("PPO: 40 held-out prompts\n");
  REQUIRE(table != std::string::npos);
  CHECK(result.output.find("reward mean  reward std  toxicity mean  toxicity std  KL (nats)", table) !=
        std::string::npos);
  const std::vector<double> before = held_out_row(result.output, table, "before");
  const std::vector<double> after = held_out_row(result.output, table, "after");
  REQUIRE(before.size() == 5);
  REQUIRE(after.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(std::isfinite(before[i]));
    CHECK(std::isfinite(after[i]));
  }
  CHECK(before[4] == 0.0);                     // before training the policy is the reference
  CHECK(before[2] > 0.0);                      // toxicity: a probability
  CHECK(before[2] < 1.0);
  CHECK(before[2] + after[2] > 0.0);
  CHECK(after[0] > before[0]);                 // the reward model's mean score rises
  CHECK(after[4] > 0.0);
  CHECK(after[4] < kTargetKl);
  for (const char* text : {"--- sample 1 ---\n", "\n  before: ", "\n  after:  ", "--- sample 3 ---\n"})
    CHECK(result.output.find(text, table) != std::string::npos);
  std::istringstream csv(read_file((out / "held_out.csv").string()));
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "run,phase,reward_mean,reward_std,toxicity_mean,toxicity_std,kl");
  CHECK(lines[1].rfind("PPO,before,", 0) == 0);
  CHECK(lines[2].rfind("PPO,after,", 0) == 0);
  CHECK(!fs::exists(out / "comparison.csv"));  // no ROUGE run
}

TEST_CASE("objective: ppo on a seq2seq policy refuses rows without prompts, conversational prompts, another "
          "tokenizer's reward model and a rollout past seq_len; grpo stays decoder-only") {
  const fs::path dir = fresh_run_dir("ppo_t5_bad", "summarize_train.jsonl", 8, 4);
  std::ofstream(dir / "text.jsonl") << "{\"prompt\": \"Hello\"}\n{\"text\": \"no prompt here\"}\n";
  std::ofstream(dir / "conv.jsonl") << "{\"prompt\": [{\"role\": \"user\", \"content\": \"Hello\"}]}\n";
  const std::string configs = std::string(FT_SOURCE_DIR) + "/configs";
  std::ofstream(dir / "config.yaml") << "model: " << configs << "/tiny-t5\ntokenizer: " << configs
                                     << "/tiny-base/tokenizer.model\nobjective: ppo\nquantization: {mode: none}\n"
                                     << "ppo: {batch_size: 2, mini_batch_size: 2, max_new_tokens: 8}\n"
                                     << "rewards: {length: 4}\n"
                                     << "data: {train: train.jsonl, eval: eval.jsonl}\n"
                                     << "seq_len: 64\nmicro_batch_size: 2\nmax_steps: 1\noutput_dir: out\n";
  const std::vector<RefusedRun> cases = {
      {"--set data.train=text.jsonl",
       "text.jsonl:2: row lacks \"prompt\": expected a \"prompt\" string or list of messages (objective: grpo and "
       "ppo generate from prompts), got keys \"text\""},
      {"--set data.train=conv.jsonl --set data.chat_template=chatml",
       "conv.jsonl:1: \"prompt\" is a list of messages (trl's conversational prompt), which a decoder-only policy's "
       "chat template renders; this policy is an encoder-decoder (seq2seq) model without one: give \"prompt\" "
       "strings"},
      {"--set rewards.model=" + kFixtures + "/reward/model",
       "rewards.model: " + kFixtures + "/reward/model's tokenizer (" + kFixtures +
           "/reward/model/tokenizer.model) is not the policy's (" + configs + "/tiny-base/tokenizer.model): set "
           "rewards.model_tokenizer to the reward model's tokenizer file"},
      {"--set ppo.max_new_tokens=64", "ppo.max_new_tokens (64) must leave room for the query within seq_len (64)"},
      // The ppo section belongs to objective: ppo.
      {"--set objective=grpo", "config.yaml:5: ppo.batch_size applies to objective: ppo, and this run's objective "
                               "is grpo"},
  };
  check_refused(dir, cases);
  std::ofstream(dir / "grpo.yaml") << "model: " << configs << "/tiny-t5\ntokenizer: " << configs
                                   << "/tiny-base/tokenizer.model\nobjective: grpo\nquantization: {mode: none}\n"
                                   << "grpo: {num_generations: 2, max_completion_length: 8}\nrewards: {length: 4}\n"
                                   << "data: {train: train.jsonl}\nseq_len: 64\nmicro_batch_size: 2\nmax_steps: 1\n";
  const CommandResult grpo = run_command("cd " + dir.string() + " && " + kBinary + " grpo.yaml");
  CHECK(grpo.exit_code == 1);
  CHECK(grpo.output.find("objective: grpo needs a decoder-only model; " + configs + "/tiny-t5/config.json is a t5 "
                         "(encoder-decoder) model") != std::string::npos);
  // The same config trains: the seq2seq policy's rollouts, rewards and update run end to end.
  const CommandResult good = run_command("cd " + dir.string() + " && " + kBinary + " config.yaml");
  CHECK_MESSAGE(good.exit_code == 0, good.output);
  CHECK(fs::exists(dir / "out/value_head.safetensors"));
}

TEST_CASE("grpo.num_iterations: 2 trains each generation batch twice, clipped against the policy at generation, and "
          "resumes between the iterations bit for bit") {
  // 6 steps at lr 1e-2, 3 generation batches; a checkpoint after step 3
  // falls between the second batch's iterations, so it carries that batch.
  const std::string config = std::string(FT_SOURCE_DIR) + "/configs/grpo-tiny.yaml";
  const fs::path runs = fs::path(FT_BINARY_DIR) / "cli_runs";
  fs::create_directories(runs);
  auto run_args = [&](const std::string& name) {
    return std::vector<std::string>{config, "--set", "grpo.num_iterations=2", "--set", "max_steps=6", "--set",
                                    "save_every=3", "--set", "lr=1.0e-2", "--set", "data.eval=", "--set",
                                    "generate.num_samples=0", "--set", "output_dir=" + (runs / name).string()};
  };
  auto command_of = [&](const std::string& name) {
    std::string command = kBinary;
    for (const std::string& arg : run_args(name)) command += " " + arg;
    return command;
  };
  for (const char* name : {"grpo_mu_full", "grpo_mu_killed"}) fs::remove_all(runs / name);
  const CommandResult full = run_command(command_of("grpo_mu_full"));
  REQUIRE_MESSAGE(full.exit_code == 0, full.output);
  const std::string metrics = (runs / "grpo_mu_full" / "metrics.jsonl").string();
  auto reward = step_metric(metrics, "reward"), loss = step_metric(metrics, "loss");
  auto clipped = step_metric(metrics, "clip_ratio/region_mean");
  REQUIRE(reward.size() == 6);
  REQUIRE(clipped.size() == 6);
  for (int64_t step = 1; step <= 5; step += 2) {  // steps 1 and 2 train on one batch, 3 and 4 on the next, ...
    CAPTURE(step);
    CHECK(reward[step + 1] == reward[step]);  // the same completions
    CHECK(loss[step + 1] != loss[step]);      // after an update
    CHECK(clipped[step] == 0.0);              // at generation the ratio is 1
  }
  // Measured 0.118, 0.147, 0.270: the second iteration's ratios moved past 1 +- epsilon.
  CHECK(clipped[2] + clipped[4] + clipped[6] > 0.0);
  CHECK(reward[3] != reward[1]);  // a new generation batch every second step

  const fs::path killed = runs / "grpo_mu_killed";
  const int status = signal_when(start_finetune(runs.string(), run_args("grpo_mu_killed"), "/dev/null"),
                                 [&] { return fs::exists(killed / "train_state.safetensors"); }, SIGKILL,
                                 "its step-3 checkpoint");
  CHECK(WIFSIGNALED(status));
  const CommandResult resumed = run_command(command_of("grpo_mu_killed") + " --resume");
  REQUIRE_MESSAGE(resumed.exit_code == 0, resumed.output);
  CHECK(resumed.output.find("resumed at step 3") != std::string::npos);
  for (const char* key : {"loss", "reward", "clip_ratio/region_mean"}) {
    CAPTURE(key);
    CHECK(step_metric((killed / "metrics.jsonl").string(), key) == step_metric(metrics, key));  // bit for bit
  }
  CHECK(read_file((killed / "adapter/adapter_model.safetensors").string()) ==
        read_file((runs / "grpo_mu_full" / "adapter/adapter_model.safetensors").string()));

  // A state saved with num_iterations 1 at step 3 holds no generation batch for step 4's second iteration.
  const fs::path other = runs / "grpo_mu_other";
  fs::remove_all(other);
  const std::string one = kBinary + " " + config + " --set max_steps=3 --set save_every=3 --set data.eval= --set "
                          "generate.num_samples=0 --set output_dir=" + other.string();
  REQUIRE(run_command(one).exit_code == 0);
  const std::string state = (other / "train_state.safetensors").string();
  const std::string before = read_file(state);
  const CommandResult refused = run_command(one + " --set max_steps=6 --set grpo.num_iterations=2 --resume");
  CHECK(refused.exit_code == 1);
  CHECK_MESSAGE(refused.output.find(state + ": step 3 falls between the grpo.num_iterations (2) steps of one "
                                    "generation batch, and the state has no saved generation batch") !=
                    std::string::npos,
                refused.output);
  CHECK(read_file(state) == before);
}

TEST_CASE("objective: grpo refuses rows without prompts, a reward model without a score head or with another "
          "tokenizer, and a bad regex") {
  const fs::path dir = fresh_run_dir("grpo_bad", "summarize_train.jsonl", 8, 4);
  std::ofstream(dir / "text.jsonl") << "{\"prompt\": \"Hello\"}\n{\"text\": \"no prompt here\"}\n";
  std::ofstream(dir / "conv.jsonl") << "{\"prompt\": [{\"role\": \"user\", \"content\": \"Hello\"}]}\n";
  std::ofstream(dir / "conv_tool.jsonl") << "{\"prompt\": [{\"role\": \"tool\", \"content\": \"4\"}]}\n";
  std::ofstream(dir / "config.yaml") << "model: " << kFixtures << "/llama_gqa\n"
                                     << "tokenizer: " << kFixtures << "/tokenizer/tokenizer.model\n"
                                     << "objective: grpo\ngrpo: {num_generations: 2, max_completion_length: 8}\n"
                                     << "rewards: {length: 4}\n"
                                     << "data: {train: train.jsonl, eval: eval.jsonl}\n"
                                     << "seq_len: 64\nmicro_batch_size: 2\nmax_steps: 1\noutput_dir: out\n";
  const std::string tiny_base = std::string(FT_SOURCE_DIR) + "/configs/tiny-base";
  const std::vector<RefusedRun> cases = {
      {"--set data.train=text.jsonl",
       "text.jsonl:2: row lacks \"prompt\": expected a \"prompt\" string or list of messages (objective: grpo and "
       "ppo generate from prompts), got keys \"text\""},
      {"--set data.train=conv.jsonl",
       "conv.jsonl:1: \"prompt\" is a list of messages (trl's conversational prompt), which the policy's chat "
       "template renders: " + kFixtures + "/tokenizer/tokenizer_config.json: no chat_template to render chat rows "
       "with; set data.chat_template to one of chatml, llama2, llama3, zephyr"},
      {"--set data.train=conv_tool.jsonl --set data.chat_template=chatml",
       "conv_tool.jsonl:1: \"prompt\": messages[0].role is \"tool\" (expected system, user or assistant)"},
      {"--set data.train=conv.jsonl --set data.chat_template=chatml",
       "eval.jsonl: its prompts are strings and data.train's (conv.jsonl) are not: give both files in one form"},
      {"--set data.train=conv.jsonl --set data.eval= --set data.chat_template=chatml --set rewards.model=" +
           kFixtures + "/llama_gqa --set rewards.model_tokenizer=" + kFixtures + "/tokenizer/tokenizer.model",
       "rewards.model: the prompts are lists of messages, so the reward model reads each prompt and completion "
       "rendered with its own tokenizer's chat template (as trl's GRPOTrainer): " + kFixtures +
           "/tokenizer/tokenizer_config.json: no chat_template to render chat rows with"},
      {"--set rewards.model=" + tiny_base,
       "rewards.model: " + tiny_base + "'s tokenizer (" + tiny_base + "/tokenizer.model) is not the policy's (" +
           kFixtures + "/tokenizer/tokenizer.model): set rewards.model_tokenizer to the reward model's tokenizer "
           "file"},
      {"--set rewards.model=" + kFixtures + "/llama_gqa --set rewards.model_tokenizer=" + kFixtures +
           "/tokenizer/tokenizer.model",
       "rewards.model: " + kFixtures + "/llama_gqa has no score head (score.weight): train one with "
       "objective: reward"},
      {"--set rewards.regex='(ab'",
       "rewards.regex: \"(ab\" is not a valid pattern at offset 3: missing closing parenthesis"},
  };
  check_refused(dir, cases);
}

// trl's conversational prompts: configs/grpo-tiny.yaml's dialogues as a
// system and a user message each, rendered with the built-in chatml template.
TEST_CASE("objective: grpo trains from conversational prompts; the samples show them rendered and keep their messages") {
  const fs::path dir = fs::path(FT_BINARY_DIR) / "cli_runs" / "grpo_conversational";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const nlohmann::json system = {{"role", "system"}, {"content", "Summarise the dialogue."}};
  auto convert = [&](const std::string& from, const fs::path& to, int rows) {
    std::ifstream in(std::string(FT_SOURCE_DIR) + "/configs/data/" + from);
    std::ofstream out(to);
    std::string line;
    for (int i = 0; i < rows && std::getline(in, line); ++i) {
      nlohmann::json row = nlohmann::json::parse(line);
      row["prompt"] = nlohmann::json::array({system, {{"role", "user"}, {"content", row["prompt"]}}});
      out << row.dump() << "\n";
    }
  };
  convert("summarize_train.jsonl", dir / "train.jsonl", 8);
  convert("summarize_eval.jsonl", dir / "eval.jsonl", 2);
  const std::string config = std::string(FT_SOURCE_DIR) + "/configs/grpo-tiny.yaml";
  const CommandResult run = run_command(
      kBinary + " " + config + " --set data.train=" + (dir / "train.jsonl").string() + " --set data.eval=" +
      (dir / "eval.jsonl").string() + " --set data.chat_template=chatml --set max_steps=2 --set metric_examples=2" +
      " --set generate.num_samples=1 --set generate.max_new_tokens=8 --set output_dir=" + (dir / "out").string());
  REQUIRE_MESSAGE(run.exit_code == 0, run.output);
  CHECK(run.output.find("chat template: chatml (data.chat_template)") != std::string::npos);
  CHECK(step_metric((dir / "out" / "metrics.jsonl").string(), "reward").size() == 2);
  CHECK(eval_rewards((dir / "out" / "metrics.jsonl").string()).size() == 2);
  CHECK_MESSAGE(run.output.find("--- sample 1 ---\n<|im_start|>system\nSummarise the dialogue.<|im_end|>\n"
                                "<|im_start|>user\nSummarize the following conversation.") != std::string::npos,
                run.output);
  CHECK(run.output.find(" --chat --chat-template chatml --file ") != std::string::npos);
  std::ifstream samples(dir / "out" / "sample_prompts.jsonl"), eval(dir / "eval.jsonl");
  std::string sample_line, eval_line;
  REQUIRE(std::getline(samples, sample_line));
  REQUIRE(std::getline(eval, eval_line));
  const nlohmann::json sample = nlohmann::json::parse(sample_line), row = nlohmann::json::parse(eval_line);
  CHECK(sample["messages"] == row["prompt"]);
  CHECK(sample["reference"] == row["completion"]);
}

TEST_CASE("configs/grpo-tiny.yaml as shipped raises the held-out reward over six seeds, KL bounded, and resumes "
          "after kill -9 bit for bit") {
  // The learning claim over six seeds, the config as shipped (30 steps of 2
  // prompts x 4 completions, ROUGE-L + length rewards, beta 0.04): one seed's
  // path turns on rounding (PPO's test above says how a sanitizer build sent
  // one down). Measured (2-core EPYC, release build), held-out reward over the
  // 32 held-out prompts, seeds 1, 5, 7, 9, 42, 1234: rises 0.97, 0.45, 0.15,
  // 0.47, 0.14, 0.93 (mean 0.52), final KL 0.98 to 3.99 nats. trl's GRPO has
  // no KL target (grpo.beta is the penalty's coefficient, not a bound), so
  // the bound is this test's own figure: twice the largest measured KL.
  constexpr double kMeanRise = 0.25, kMaxKl = 8.0;
  const std::string config = std::string(FT_SOURCE_DIR) + "/configs/grpo-tiny.yaml";
  const fs::path runs = fs::path(FT_BINARY_DIR) / "cli_runs";
  fs::create_directories(runs);
  const std::vector<int> seeds = {1, 5, 7, 9, 42, 1234};
  double rise_sum = 0.0;
  int rising = 0;
  for (const int seed : seeds) {
    CAPTURE(seed);
    const fs::path learn = runs / "grpo_learn";
    fs::remove_all(learn);
    const CommandResult run = run_command(kBinary + " " + config + " --set seed=" + std::to_string(seed) +
                                          " --set generate.num_samples=0 --set output_dir=" + learn.string());
    REQUIRE_MESSAGE(run.exit_code == 0, run.output);
    CHECK(run.output.find("eval reward (held-out prompts) ") != std::string::npos);
    const auto evals = eval_rewards((learn / "metrics.jsonl").string());
    REQUIRE(evals.size() == 2);
    MESSAGE("seed ", seed, ": held-out reward ", evals[0].first, " -> ", evals[1].first, ", KL ", evals[1].second);
    rise_sum += evals[1].first - evals[0].first;
    rising += evals[1].first > evals[0].first ? 1 : 0;
    CHECK(evals[0].second == 0.0);  // before training the policy is the reference
    CHECK(evals[1].second > 0.0);
    CHECK(evals[1].second <= kMaxKl);
  }
  CHECK(rise_sum / double(seeds.size()) > kMeanRise);
  CHECK(rising >= int(seeds.size()) - 1);

  // Resume: a short run (8 steps, a checkpoint every 4) against the same run
  // killed after its first checkpoint. The killed run evaluates nothing: its
  // adapter must still be the full run's (evaluation draws from seeds of its own).
  constexpr int64_t kSteps = 8, kSaveEvery = 4;
  const std::vector<std::string> short_run = {
      config, "--set", "max_steps=" + std::to_string(kSteps), "--set", "save_every=" + std::to_string(kSaveEvery),
      "--set", "metric_examples=16", "--set", "eval_every=0", "--set", "generate.num_samples=0"};
  auto run_args = [&](const std::string& name) {
    std::vector<std::string> args = short_run;
    args.insert(args.end(), {"--set", "output_dir=" + (runs / name).string()});
    if (name == "grpo_killed") args.insert(args.end(), {"--set", "data.eval="});
    return args;
  };
  for (const char* name : {"grpo_full", "grpo_killed"}) fs::remove_all(runs / name);
  std::string command = kBinary;
  for (const std::string& arg : run_args("grpo_full")) command += " " + arg;
  const CommandResult full = run_command(command);
  REQUIRE_MESSAGE(full.exit_code == 0, full.output);

  // The same run killed after its first checkpoint, then resumed.
  const fs::path killed = runs / "grpo_killed";
  const pid_t child = start_finetune(runs.string(), run_args("grpo_killed"), (runs / "grpo_killed.log").string());
  const int status = signal_when(
      child, [&] { return fs::exists(killed / "train_state.safetensors"); }, SIGKILL, "its first checkpoint");
  CHECK(WIFSIGNALED(status));
  CHECK(!fs::exists(killed / "adapter"));
  command = kBinary;
  for (const std::string& arg : run_args("grpo_killed")) command += " " + arg;
  const CommandResult resumed = run_command(command + " --resume");
  REQUIRE_MESSAGE(resumed.exit_code == 0, resumed.output);
  CHECK(resumed.output.find("resumed at step " + std::to_string(kSaveEvery)) != std::string::npos);
  for (const char* key : {"loss", "reward", "completions/mean_length"}) {
    CAPTURE(key);
    const auto want = step_metric((runs / "grpo_full" / "metrics.jsonl").string(), key);
    const auto got = step_metric((killed / "metrics.jsonl").string(), key);
    CHECK(want.size() == size_t(kSteps));
    CHECK(got == want);  // bit for bit
  }
  CHECK(read_file((killed / "adapter/adapter_model.safetensors").string()) ==
        read_file((runs / "grpo_full" / "adapter/adapter_model.safetensors").string()));
}

TEST_CASE("generate streams a character split across byte-level tokens once it is whole: the stream is --file's text") {
  // The tiny Qwen2 (byte-level BPE) answers greedily with the lone bytes 0xAE
  // and 0xDD alternating (an invalid byte decodes to U+FFFD, a pair to one
  // character), and under a repetition penalty with an "î" split over two
  // tokens: streamed, each character waits for its last byte, so the stream
  // is valid UTF-8 and equals the batched --file text (transformers' text).
  const fs::path dir = fs::path(FT_BINARY_DIR) / "cli_runs" / "generate_split_characters";
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Case {
    std::string prompt, flags;
  };
  for (const Case& c : {Case{"Hello there", "--system 'Be brief.' --max-new-tokens 10"},
                        Case{"x", "--max-new-tokens 12 --repetition-penalty 1.5"}}) {
    CAPTURE(c.prompt);
    std::ofstream(dir / "rows.jsonl") << nlohmann::json{{"prompt", c.prompt}}.dump() << "\n";
    const std::string generate = kBinary + " generate " + kFixtures + "/qwen2_tiny --chat --chat-template chatml " +
                                 c.flags;
    const CommandResult streamed = run_command(generate + " --prompt '" + c.prompt + "' 2>/dev/null");
    const CommandResult batched = run_command(generate + " --file " + (dir / "rows.jsonl").string() + " 2>/dev/null");
    REQUIRE(streamed.exit_code == 0);
    REQUIRE(batched.exit_code == 0);
    const std::string completion = nlohmann::json::parse(batched.output)["completion"];
    const bool split_character =
        completion.find("\xEF\xBF\xBD") != std::string::npos || completion.find("\xC3\xAE") != std::string::npos;
    CHECK(split_character);
    CHECK(streamed.output == completion + "\n");
  }
}
