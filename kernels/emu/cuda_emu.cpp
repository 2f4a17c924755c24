// The emulator's scheduler (fibers, barriers, warp collectives), its device
// memory with guard zones, and the subset of the CUDA runtime API host code
// uses, so that host code runs unchanged against emulated kernels.
//
// Launch state is a plain global: kernels are launched from one OS thread at a
// time. Every fiber runs on that thread and only switches inside barrier() and
// warp_collective(), which is what makes plain read-modify-write atomics safe.
#include "kernels/emu/cuda_emu.h"

#include <elf.h>
#include <link.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>

#if defined(__SANITIZE_ADDRESS__)
#define FT_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FT_EMU_ASAN 1
#endif
#endif
#ifdef FT_EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

#if !defined(__x86_64__)
#error "cuda_emu's fiber switch is written for x86-64"
#endif

// ft_emu_switch(save, load): pushes the callee-saved registers, stores the
// stack pointer in *save and continues on the stack `load` (popping its saved
// registers and returning into it). Ten instructions instead of swapcontext,
// which makes a signal-mask syscall per switch. Kernels never change the FP
// control registers, so those are not saved.
asm(R"(
  .text
  .globl ft_emu_switch
  .hidden ft_emu_switch
  .type ft_emu_switch, @function
ft_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ft_emu_switch, .-ft_emu_switch
)");
extern "C" void ft_emu_switch(void** save, void* load);

namespace cuda_emu {
namespace {

constexpr int kMaxThreads = 1024;
constexpr size_t kStackBytes = 256 << 10;
constexpr size_t kStackGuard = 64 << 10;  // PROT_NONE below each stack: overflow faults
constexpr size_t kGuardBytes = 256;       // checked zone around allocations and dynamic smem
constexpr unsigned char kGuardByte = 0xA5;
constexpr unsigned char kPoisonByte = 0xFF;  // NaN as f32, f16 and bf16; -1 as an integer
constexpr size_t kDefaultSmem = 48 << 10, kMaxSmem = 227 << 10;

enum class Wait : unsigned char { runnable, barrier, warp, exited };

// ASan keeps a shadow of the current stack; a switch to another stack must be
// announced (start) and confirmed on arrival (finish), or ASan takes the
// fiber's frames for overflows of the scheduler's stack. No-ops without ASan.
struct StackRange {
  const void* bottom = nullptr;
  size_t bytes = 0;
};
#ifdef FT_EMU_ASAN
void asan_leave_stack(void** fake_stack, StackRange to) {
  __sanitizer_start_switch_fiber(fake_stack, to.bottom, to.bytes);
}
void asan_arrive(void* fake_stack, StackRange* from) {
  StackRange ignored;
  StackRange& out = from ? *from : ignored;
  __sanitizer_finish_switch_fiber(fake_stack, &out.bottom, &out.bytes);
}
void asan_unpoison(void* p, size_t bytes) { __asan_unpoison_memory_region(p, bytes); }
#else
void asan_leave_stack(void**, StackRange) {}
void asan_arrive(void*, StackRange*) {}
void asan_unpoison(void*, size_t) {}
#endif

struct Thread {
  Wait wait;
  int fiber;  // index into stacks/fiber_sp; -1 until the thread first runs
  uint3 idx;
  const char* op;  // where it waits
  const char* file;
  int line;
  unsigned mask;
  WarpFn fn;
  unsigned active;  // __activemask: its warp's live lanes at its last synchronisation
};

struct Emu {
  const char* kernel = nullptr;  // non-null while a launch runs
  void (*body)(void*) = nullptr;
  void* params = nullptr;
  int nthreads = 0;
  std::vector<Thread> threads = std::vector<Thread>(kMaxThreads);
  std::vector<WarpLane> lanes = std::vector<WarpLane>(kMaxThreads);
  std::vector<int> order = std::vector<int>(kMaxThreads);
  int current = -1;    // thread on the running fiber; -1 while the scheduler runs
  bool batch = false;  // one fiber runs threads back to back until one synchronises
  int next_in_batch = 0;
  int live = 0, at_barrier = 0, at_warp = 0;
  std::string fiber_error;  // set on a fiber, thrown by the scheduler (never unwind a fiber)
  void* scheduler_sp = nullptr;
  StackRange scheduler_stack;  // the launching thread's stack, as ASan reports it to a fiber
  std::vector<char*> stacks;  // kept across launches: mmap per launch is slow
  std::vector<void*> fiber_sp;
  int fibers_used = 0;
  std::vector<std::pair<char*, size_t>> static_smem;  // the kernel's __shared__ statics
  // Dynamic shared memory plus its guard zone, 128-byte aligned as a GPU's
  // (the window's base, where a kernel without static __shared__ finds it):
  // wmma operands there need 256-bit alignment.
  struct alignas(128) SmemLine {
    unsigned char bytes[128];
  };
  std::vector<SmemLine> smem_lines;
  unsigned char* smem = nullptr;
  size_t smem_bytes = 0;
  bool schedule_set = false;
  Schedule schedule;
  uint64_t rng = 0;
};
Emu emu;

struct Allocation {
  char* raw;
  size_t bytes, total;
};
std::mutex memory_mutex;
std::map<uintptr_t, Allocation> allocations;  // keyed by the pointer cudaMalloc returned
std::map<const void*, int> max_dynamic_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize
const char* last_kernel = "(none)";
cudaError_t last_error = cudaSuccess;

std::string str(uint3 v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", v.x, v.y, v.z);
  return buf;
}
std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}
std::string thread_name(int t) { return "thread " + str(emu.threads[t].idx) + " of block " + str(blockIdx); }
std::string site(const Thread& th) { return std::string(th.op) + " at " + th.file + ":" + std::to_string(th.line); }
bool same_site(const Thread& a, const Thread& b) {
  return a.line == b.line && (a.file == b.file || std::strcmp(a.file, b.file) == 0) &&
         (a.op == b.op || std::strcmp(a.op, b.op) == 0);
}

[[noreturn]] void fail(const std::string& what) {
  throw Error("cuda_emu: kernel " + std::string(emu.kernel) + ": " + what);
}

uint64_t next_random() {  // splitmix64
  uint64_t z = (emu.rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ---- fibers --------------------------------------------------------------------

void enter(int t) {
  emu.current = t;
  threadIdx = emu.threads[t].idx;
}

// Fiber 0 starts in batch mode and runs threads back to back, so a block whose
// threads never synchronise costs one fiber switch. The first thread that
// synchronises keeps the fiber; the threads not yet started get their own.
[[noreturn]] void fiber_main() {
  asan_arrive(nullptr, &emu.scheduler_stack);
  for (;;) {
    emu.body(emu.params);
    Thread& done = emu.threads[emu.current];
    done.wait = Wait::exited;
    --emu.live;
    if (!emu.batch || emu.next_in_batch == emu.nthreads) break;
    int t = emu.order[emu.next_in_batch++];
    emu.threads[t].fiber = done.fiber;
    enter(t);
  }
  void* finished;
  asan_leave_stack(nullptr, emu.scheduler_stack);  // this fiber's frames are done with for good
  ft_emu_switch(&finished, emu.scheduler_sp);
  __builtin_unreachable();
}

int new_fiber() {
  int f = emu.fibers_used++;
  if (f == int(emu.stacks.size())) {
    void* base = mmap(nullptr, kStackGuard + kStackBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base == MAP_FAILED || mprotect(base, kStackGuard, PROT_NONE) != 0) fail("cannot map a fiber stack");
    emu.stacks.push_back(static_cast<char*>(base));
    emu.fiber_sp.push_back(nullptr);
  }
  // A reused stack still carries the shadow of the frames its last thread
  // left behind (fiber_main's never returns).
  asan_unpoison(emu.stacks[f] + kStackGuard, kStackBytes);
  // Initial frame for ft_emu_switch: six zero registers, then the "return"
  // into fiber_main with the stack aligned as if fiber_main had been called.
  void** top = reinterpret_cast<void**>(emu.stacks[f] + kStackGuard + kStackBytes);
  top[-1] = nullptr;
  top[-2] = reinterpret_cast<void*>(&fiber_main);
  for (int i = 3; i <= 8; ++i) top[-i] = nullptr;
  emu.fiber_sp[f] = top - 8;
  return f;
}

// Fiber side: back to the scheduler until it resumes this thread.
void yield() {
  void* fake_stack = nullptr;
  asan_leave_stack(&fake_stack, emu.scheduler_stack);
  ft_emu_switch(&emu.fiber_sp[emu.threads[emu.current].fiber], emu.scheduler_sp);
  asan_arrive(fake_stack, &emu.scheduler_stack);
}

// The fiber never resumes, so nothing on its stack is destroyed: the message
// is taken by value and moved out, leaving no heap buffer behind to leak.
[[noreturn]] void fiber_fail(std::string what) {
  emu.fiber_error = std::move(what);
  yield();
  __builtin_unreachable();
}

Thread& self(const char* op) {
  if (emu.current < 0) throw Error(std::string("cuda_emu: ") + op + " called outside a kernel");
  return emu.threads[emu.current];
}

// Scheduler side: run thread t until it waits or exits.
void resume(int t) {
  Thread& th = emu.threads[t];
  if (th.fiber < 0) th.fiber = new_fiber();
  enter(t);
  void* fake_stack = nullptr;
  asan_leave_stack(&fake_stack, {emu.stacks[th.fiber] + kStackGuard, kStackBytes});
  ft_emu_switch(&emu.scheduler_sp, emu.fiber_sp[th.fiber]);
  asan_arrive(fake_stack, nullptr);
  emu.current = -1;
  if (!emu.fiber_error.empty()) fail(emu.fiber_error);
}

// ---- the block scheduler ---------------------------------------------------------

void shuffle_order() {
  for (int i = emu.nthreads - 1; i > 0; --i) std::swap(emu.order[i], emu.order[next_random() % (i + 1)]);
}

// Lists where every waiting thread waits, grouped by site: the report for
// deadlocks and for divergent barriers or warp collectives.
std::string waits_summary() {
  std::map<std::string, std::pair<int, int>> groups;  // description -> (count, first thread)
  for (int t = 0; t < emu.nthreads; ++t) {
    const Thread& th = emu.threads[t];
    if (th.wait != Wait::barrier && th.wait != Wait::warp) continue;
    std::string key = site(th) + (th.wait == Wait::warp ? " (mask " + hex(th.mask) + ")" : "");
    auto [it, fresh] = groups.try_emplace(key, 0, t);
    ++it->second.first;
  }
  std::string out;
  for (auto& [key, group] : groups)
    out += "\n  " + std::to_string(group.first) + " thread(s) wait at " + key + ", first " + thread_name(group.second);
  return out;
}

// Lanes of t's warp that exist and have not exited. Read only between
// rounds, when it does not depend on the order threads ran in.
unsigned warp_live_mask(int t) {
  int base = t & ~31;
  unsigned mask = 0;
  for (int lane = 0; lane < 32 && base + lane < emu.nthreads; ++lane)
    if (emu.threads[base + lane].wait != Wait::exited) mask |= 1u << lane;
  return mask;
}

void release(int t) {
  emu.threads[t].wait = Wait::runnable;
  emu.threads[t].active = warp_live_mask(t);
}

// Completes the warp collective thread t waits at, once every lane its mask
// names waits at the same one. A named lane that has exited is a bug.
bool complete_warp_op(int t) {
  const Thread& th = emu.threads[t];
  int base = t & ~31;
  for (int lane = 0; lane < 32; ++lane) {
    if (!(th.mask >> lane & 1)) continue;
    int u = base + lane;
    if (u >= emu.nthreads || emu.threads[u].wait == Wait::exited)
      fail(thread_name(t) + ": " + site(th) + " with mask " + hex(th.mask) + " names lane " + std::to_string(lane) +
           (u >= emu.nthreads ? ", which does not exist" : ", which has exited"));
    const Thread& other = emu.threads[u];
    if (other.wait != Wait::warp || other.mask != th.mask || other.fn != th.fn || !same_site(th, other))
      return false;
  }
  if (th.fn) th.fn(&emu.lanes[base], th.mask);
  for (int lane = 0; lane < 32; ++lane)
    if (th.mask >> lane & 1) release(base + lane);
  emu.at_warp -= __builtin_popcount(th.mask);
  return true;
}

// Called when no thread is runnable: completes warp collectives, else releases
// a barrier that every live thread waits at, else reports the block as stuck.
void release_waiters() {
  bool progress = false;
  for (int t = 0; t < emu.nthreads && emu.at_warp > 0; ++t)
    if (emu.threads[t].wait == Wait::warp && complete_warp_op(t)) progress = true;
  if (progress) return;
  if (emu.at_barrier != emu.live) fail("deadlock in block " + str(blockIdx) + ":" + waits_summary());
  const Thread* first = nullptr;
  for (int t = 0; t < emu.nthreads; ++t) {
    const Thread& th = emu.threads[t];
    if (th.wait != Wait::barrier) continue;
    if (!first) first = &th;
    if (!same_site(*first, th)) fail("divergent __syncthreads in block " + str(blockIdx) + ":" + waits_summary());
  }
  for (int t = 0; t < emu.nthreads; ++t)
    if (emu.threads[t].wait == Wait::barrier) release(t);
  emu.at_barrier = 0;
}

void check_smem_guard() {
  for (size_t i = 0; i < kGuardBytes; ++i)
    if (emu.smem[emu.smem_bytes + i] != kGuardByte)
      fail("block " + str(blockIdx) + " wrote past its " + std::to_string(emu.smem_bytes) +
           " bytes of dynamic shared memory (byte " + std::to_string(emu.smem_bytes + i) + ")");
}

void run_block() {
  for (int t = 0; t < emu.nthreads; ++t) {
    emu.threads[t].wait = Wait::runnable;
    emu.threads[t].fiber = -1;
  }
  for (int t = 0; t < emu.nthreads; ++t) emu.threads[t].active = warp_live_mask(t);
  emu.live = emu.nthreads;
  emu.at_barrier = emu.at_warp = 0;
  emu.fibers_used = 0;
  // Shared memory starts as poison, so reads of unwritten slots give NaN.
  for (auto [p, bytes] : emu.static_smem) std::memset(p, kPoisonByte, bytes);
  std::memset(emu.smem, kPoisonByte, emu.smem_bytes);
  if (emu.schedule.order == Order::random) shuffle_order();

  emu.batch = true;
  emu.next_in_batch = 1;
  resume(emu.order[0]);
  for (;;) {
    if (emu.schedule.order == Order::random) shuffle_order();
    for (int i = 0; i < emu.nthreads; ++i)
      if (emu.threads[emu.order[i]].wait == Wait::runnable) resume(emu.order[i]);
    if (emu.live == 0) break;
    release_waiters();
  }
  check_smem_guard();
}

void check_launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem_bytes) {
  auto invalid = [&](const std::string& why) {
    throw Error("cuda_emu: kernel " + std::string(name) + ": invalid launch: " + why);
  };
  size_t threads = size_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > kMaxThreads || block.z > 64) invalid("block " + str(block) + " (max 1024 threads)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    invalid("grid " + str(grid));
  size_t allowed = kDefaultSmem;
  {
    std::lock_guard lock(memory_mutex);
    if (auto it = max_dynamic_smem.find(kernel); it != max_dynamic_smem.end()) allowed = size_t(it->second);
  }
  if (smem_bytes > allowed || smem_bytes > kMaxSmem)
    invalid(std::to_string(smem_bytes) + " bytes of dynamic shared memory; over 48 KiB needs "
            "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), max 227 KiB");
}

// ---- finding a kernel's __shared__ statics ----------------------------------------------

// The executable's symbols: functions by address, and every function-local
// static (mangled "_ZZ<function>E<name>") with its address and size.
struct Symbols {
  std::map<uintptr_t, std::string> functions;
  std::vector<std::tuple<std::string, char*, size_t>> statics;
};

uintptr_t load_base() {
  uintptr_t base = 0;
  dl_iterate_phdr([](dl_phdr_info* info, size_t, void* out) {
    *static_cast<uintptr_t*>(out) = info->dlpi_addr;
    return 1;  // the first object is the executable
  }, &base);
  return base;
}

Symbols read_symbols() {
  Symbols out;
  std::ifstream file("/proc/self/exe", std::ios::binary);
  std::vector<char> image{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  if (image.size() < sizeof(Elf64_Ehdr)) return out;
  auto* header = reinterpret_cast<const Elf64_Ehdr*>(image.data());
  auto* sections = reinterpret_cast<const Elf64_Shdr*>(image.data() + header->e_shoff);
  uintptr_t base = load_base();
  for (int i = 0; i < header->e_shnum; ++i) {
    if (sections[i].sh_type != SHT_SYMTAB) continue;
    auto* symbols = reinterpret_cast<const Elf64_Sym*>(image.data() + sections[i].sh_offset);
    const char* names = image.data() + sections[sections[i].sh_link].sh_offset;
    for (size_t k = 0; k < sections[i].sh_size / sizeof(Elf64_Sym); ++k) {
      const Elf64_Sym& sym = symbols[k];
      const char* name = names + sym.st_name;
      if (sym.st_value == 0) continue;
      if (ELF64_ST_TYPE(sym.st_info) == STT_FUNC) out.functions[base + sym.st_value] = name;
      if (ELF64_ST_TYPE(sym.st_info) == STT_OBJECT && std::strncmp(name, "_ZZ", 3) == 0)
        out.statics.emplace_back(name, reinterpret_cast<char*>(base + sym.st_value), sym.st_size);
    }
  }
  return out;
}

// The bytes of a static that the program may touch. Clang's AddressSanitizer
// pads each global with its redzone and the symbol's size counts the padding,
// which run_block's memset must leave alone.
size_t usable_bytes(char* p, size_t symbol_bytes) {
#ifdef FT_EMU_ASAN
  if (void* redzone = __asan_region_is_poisoned(p, symbol_bytes)) return size_t(static_cast<char*>(redzone) - p);
#else
  (void)p;
#endif
  return symbol_bytes;
}

// A kernel's local statics are its __shared__ variables (CUDA allows no other).
std::vector<std::pair<char*, size_t>> static_shared_of(const void* kernel) {
  static const Symbols symbols = read_symbols();
  static std::map<const void*, std::vector<std::pair<char*, size_t>>> cache;
  std::lock_guard lock(memory_mutex);
  auto [it, fresh] = cache.try_emplace(kernel);
  if (!fresh) return it->second;
  auto fn = symbols.functions.find(reinterpret_cast<uintptr_t>(kernel));
  if (fn == symbols.functions.end()) return {};
  const std::string& name = fn->second;
  std::string prefix = name.rfind("_Z", 0) == 0 ? "_ZZ" + name.substr(2) + "E"
                                                : "_ZZ" + std::to_string(name.size()) + name + "E";
  for (auto& [static_name, p, bytes] : symbols.statics)
    if (static_name.rfind(prefix, 0) == 0) it->second.emplace_back(p, usable_bytes(p, bytes));
  return it->second;
}

Schedule default_schedule() {
  const char* env = std::getenv("FT_EMU_SCHEDULE");
  return env && *env ? parse_schedule(env) : Schedule{};
}

// ---- device memory -----------------------------------------------------------------

// First byte of [p, p + n) that is not guard, or n.
size_t first_broken(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (static_cast<unsigned char>(p[i]) != kGuardByte) return i;
  return n;
}

void fill_guards(uintptr_t user, const Allocation& a) {
  std::memset(a.raw, kGuardByte, kGuardBytes);
  std::memset(reinterpret_cast<char*>(user) + a.bytes, kGuardByte, a.total - kGuardBytes - a.bytes);
}

// Throws when a guard zone was written, after repairing it so later checks
// report only new damage. Caller holds memory_mutex.
void check_guards(uintptr_t user, const Allocation& a, const std::string& culprit) {
  char* end = reinterpret_cast<char*>(user) + a.bytes;
  size_t back = a.total - kGuardBytes - a.bytes;
  size_t before = first_broken(a.raw, kGuardBytes), after = first_broken(end, back);
  if (before == kGuardBytes && after == back) return;
  fill_guards(user, a);
  std::string offset = before < kGuardBytes ? std::to_string(long(before) - long(kGuardBytes)) + " (before the start)"
                                            : std::to_string(a.bytes + after) + " (" + std::to_string(after) +
                                                  " bytes past the end)";
  throw Error("cuda_emu: " + culprit + " wrote outside a " + std::to_string(a.bytes) +
              "-byte device allocation: byte offset " + offset + " was modified");
}

// Device pointers must stay inside their allocation; other pointers are host memory.
void check_range(const void* p, size_t n, const char* what) {
  std::lock_guard lock(memory_mutex);
  auto it = allocations.upper_bound(reinterpret_cast<uintptr_t>(p));
  if (it == allocations.begin()) return;
  --it;
  uintptr_t start = it->first, q = reinterpret_cast<uintptr_t>(p);
  if (q >= reinterpret_cast<uintptr_t>(it->second.raw) + it->second.total) return;
  if (q + n > start + it->second.bytes)
    throw Error(std::string("cuda_emu: ") + what + ": " + std::to_string(n) + " bytes at offset " +
                std::to_string(q - start) + " overrun a " + std::to_string(it->second.bytes) + "-byte device allocation");
}

}  // namespace

// ---- schedules ------------------------------------------------------------------------

Schedule parse_schedule(const std::string& text) {
  if (text == "inorder") return {Order::inorder, 0};
  if (text == "reverse") return {Order::reverse, 0};
  if (text.rfind("random:", 0) == 0 && text.size() > 7) return {Order::random, std::stoull(text.substr(7))};
  throw Error("cuda_emu: schedule must be inorder, reverse or random:SEED, got '" + text + "'");
}

std::string to_string(Schedule s) {
  if (s.order == Order::inorder) return "inorder";
  if (s.order == Order::reverse) return "reverse";
  return "random:" + std::to_string(s.seed);
}

void set_schedule(Schedule s) {
  emu.schedule = s;
  emu.schedule_set = true;
  emu.rng = s.seed;
}

Schedule schedule() {
  if (!emu.schedule_set) set_schedule(default_schedule());
  return emu.schedule;
}

std::vector<Schedule> standard_schedules() {
  return {{Order::inorder, 0}, {Order::reverse, 0}, {Order::random, 1}, {Order::random, 2}, {Order::random, 3}};
}

// ---- device-side entry points ------------------------------------------------------------

void barrier(const char* file, int line) {
  Thread& th = self("__syncthreads");
  emu.batch = false;
  th.wait = Wait::barrier;
  th.op = "__syncthreads";
  th.file = file;
  th.line = line;
  ++emu.at_barrier;
  yield();
}

uint64_t warp_collective(const char* op, unsigned mask, WarpFn fn, WarpLane lane, const char* file, int line) {
  Thread& th = self(op);
  int t = emu.current;
  if (!(mask >> (t & 31) & 1))
    fiber_fail(thread_name(t) + ": " + op + " at " + file + ":" + std::to_string(line) + " with mask " + hex(mask) +
               " excludes the calling lane " + std::to_string(t & 31));
  emu.batch = false;
  emu.lanes[t] = lane;
  th.wait = Wait::warp;
  th.op = op;
  th.file = file;
  th.line = line;
  th.mask = mask;
  th.fn = fn;
  ++emu.at_warp;
  yield();
  return emu.lanes[t].out;
}

unsigned live_lanes() { return self("__activemask").active; }

void* dynamic_shared() {
  self("dynamic shared memory");
  return emu.smem;
}

// Shuffles: the source lane computed by `source` (within the lane's width
// segment, or -1 to keep the own value); a source outside the mask is not
// participating, so the result is undefined: poison.
template <int (*source)(int lane, int arg, int width)>
void shuffle(WarpLane* lanes, unsigned mask) {
  for (int lane = 0; lane < 32; ++lane) {
    if (!(mask >> lane & 1)) continue;
    WarpLane& me = lanes[lane];
    if (me.width < 1 || me.width > 32 || (me.width & (me.width - 1)))
      fail("shuffle width " + std::to_string(me.width) + " is not a power of two up to 32");
    int src = source(lane, me.arg, me.width);
    me.out = src < 0 ? me.in : (mask >> src & 1) ? lanes[src].in : ~uint64_t(0);
  }
}
int source_idx(int lane, int arg, int width) { return (lane & ~(width - 1)) + (arg & (width - 1)); }
int source_up(int lane, int arg, int width) { return (lane & (width - 1)) >= arg ? lane - arg : -1; }
int source_down(int lane, int arg, int width) { return (lane & (width - 1)) + arg < width ? lane + arg : -1; }
int source_xor(int lane, int arg, int width) {
  int src = lane ^ arg;
  return src >= 0 && src < 32 && src / width == lane / width ? src : -1;
}
void shfl_idx(WarpLane* lanes, unsigned mask) { shuffle<source_idx>(lanes, mask); }
void shfl_up(WarpLane* lanes, unsigned mask) { shuffle<source_up>(lanes, mask); }
void shfl_down(WarpLane* lanes, unsigned mask) { shuffle<source_down>(lanes, mask); }
void shfl_xor(WarpLane* lanes, unsigned mask) { shuffle<source_xor>(lanes, mask); }

void wmma_operand(WarpLane* lanes, unsigned) {
  const WarpLane& first = lanes[0];
  for (int lane = 1; lane < 32; ++lane)
    if (lanes[lane].ptr != first.ptr || lanes[lane].arg != first.arg)
      fail("wmma load/store: lane " + std::to_string(lane) + " passes another pointer or ldm than lane 0 (ldm " +
           std::to_string(lanes[lane].arg) + " vs " + std::to_string(first.arg) + "); all lanes must agree");
  if (reinterpret_cast<uintptr_t>(first.ptr) % 32 != 0)
    fail("wmma load/store: pointer is not 256-bit aligned (address % 32 = " +
         std::to_string(reinterpret_cast<uintptr_t>(first.ptr) % 32) + ")");
  if (first.arg * first.width % 16 != 0)
    fail("wmma load/store: ldm " + std::to_string(first.arg) + " is not a multiple of 16 bytes");
}

void vote_ballot(WarpLane* lanes, unsigned mask) {
  unsigned ballot = 0;
  for (int lane = 0; lane < 32; ++lane)
    if ((mask >> lane & 1) && lanes[lane].in) ballot |= 1u << lane;
  for (int lane = 0; lane < 32; ++lane)
    if (mask >> lane & 1) lanes[lane].out = ballot;
}

// ---- streams (see "Streams" at cudaDeviceSynchronize) ----

namespace {
struct PendingCopy {
  void* dst;
  const void* src;
  size_t bytes;
};
struct EmuStream {
  bool blocking = true;
  uint64_t issued = 0, landed = 0;  // copies issued and landed so far, in issue order
  std::deque<PendingCopy> pending;  // the copies issued but not landed, oldest first
};
struct EmuEvent {
  std::chrono::steady_clock::time_point time;
  EmuStream* stream = nullptr;  // null: recorded on the legacy stream, or never
  uint64_t issued = 0;          // the stream's copies issued at the record
};
// Built on first use and never destroyed: tests create backends (and so
// streams) in static initialisers and free memory in static destructors.
std::set<EmuStream*>& streams() {
  static auto* all = new std::set<EmuStream*>;
  return *all;
}

void land(EmuStream& stream, uint64_t up_to) {
  while (stream.landed < up_to && !stream.pending.empty()) {
    const PendingCopy copy = stream.pending.front();
    stream.pending.pop_front();
    std::memmove(copy.dst, copy.src, copy.bytes);
    stream.landed += 1;
  }
}
void land_all() {
  for (EmuStream* stream : streams()) land(*stream, stream->issued);
}
// Legacy-stream work waits for every blocking stream.
void before_legacy_work() {
  for (EmuStream* stream : streams())
    if (stream->blocking) land(*stream, stream->issued);
}
}  // namespace

// ---- launches ------------------------------------------------------------------------------

void run(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem_bytes, void (*body)(void*),
         void* params) {
  if (emu.kernel)
    throw Error("cuda_emu: kernel " + std::string(emu.kernel) + " launched " + name + ": not supported");
  check_launch(name, kernel, grid, block, smem_bytes);
  before_legacy_work();  // our kernels run on the legacy stream
  schedule();  // reads FT_EMU_SCHEDULE on first use
  emu.kernel = last_kernel = name;
  struct Finish {  // also after a throw: the abandoned fibers' stacks are simply reused
    ~Finish() {
      emu.kernel = nullptr;
      emu.current = -1;
      emu.fiber_error.clear();
    }
  } finish;
  emu.body = body;
  emu.params = params;
  emu.nthreads = int(block.x * block.y * block.z);
  blockDim = block;
  gridDim = grid;
  for (int t = 0; t < emu.nthreads; ++t) {
    emu.threads[t].idx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
    emu.order[t] = emu.schedule.order == Order::reverse ? emu.nthreads - 1 - t : t;
  }
  emu.static_smem = static_shared_of(kernel);
  emu.smem_bytes = smem_bytes;
  emu.smem_lines.resize((smem_bytes + kGuardBytes + 127) / 128);
  emu.smem = emu.smem_lines.front().bytes;
  std::memset(emu.smem + smem_bytes, kGuardByte, kGuardBytes);

  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        run_block();
      }
  std::lock_guard lock(memory_mutex);
  for (auto& [user, a] : allocations) check_guards(user, a, "kernel " + std::string(name));
}

}  // namespace cuda_emu

// ---- the CUDA runtime subset (C linkage, from cuda_runtime_api.h) ---------------------------------

using namespace cuda_emu;
using Clock = std::chrono::steady_clock;

// Allocations sit between guard zones: kGuardBytes before, at least kGuardBytes
// after (the end rounds up to keep 256-byte alignment, like cudaMalloc).
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  size_t total = kGuardBytes + (bytes + 255) / 256 * 256 + kGuardBytes;
  char* raw = static_cast<char*>(std::aligned_alloc(256, total));
  if (!raw) return last_error = cudaErrorMemoryAllocation;
  Allocation a{raw, bytes, total};
  uintptr_t user = reinterpret_cast<uintptr_t>(raw + kGuardBytes);
  std::memset(raw + kGuardBytes, kPoisonByte, bytes);  // fresh memory reads as NaN
  fill_guards(user, a);
  std::lock_guard lock(memory_mutex);
  allocations.emplace(user, a);
  *p = raw + kGuardBytes;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  land_all();  // cudaFree synchronises the device
  std::lock_guard lock(memory_mutex);
  auto it = allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocations.end()) throw Error("cuda_emu: cudaFree of a pointer cudaMalloc did not return");
  Allocation a = it->second;
  allocations.erase(it);
  check_guards(reinterpret_cast<uintptr_t>(p), a, "kernel " + std::string(last_kernel) + " (found at cudaFree)");
  std::free(a.raw);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes);
  return *p || bytes == 0 ? cudaSuccess : (last_error = cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* p) {
  land_all();
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  check_range(dst, bytes, "cudaMemcpy destination");
  check_range(src, bytes, "cudaMemcpy source");
  before_legacy_work();
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
// On a created stream: deferred (see "Streams" below).
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (!s) return cudaMemcpy(dst, src, bytes, kind);
  check_range(dst, bytes, "cudaMemcpyAsync destination");
  check_range(src, bytes, "cudaMemcpyAsync source");
  auto* stream = reinterpret_cast<EmuStream*>(s);
  std::memset(dst, kPoisonByte, bytes);
  stream->pending.push_back({dst, src, bytes});
  stream->issued += 1;
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  check_range(dst, bytes, "cudaMemset");
  before_legacy_work();
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) { return cudaMemset(dst, value, bytes); }

cudaError_t cudaGetLastError() {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return last_error; }
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    default: return "cuda_emu: unexpected error";
  }
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    std::lock_guard lock(memory_mutex);
    max_dynamic_smem[func] = value;
  }
  return cudaSuccess;
}

// One emulated device, always present.
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

// Streams. Kernels, and copies on the legacy default stream (null), run at
// issue. A copy on a created stream is deferred, so that a missing event
// shows: its destination is poisoned when it is issued (the old bytes are
// gone as early as the real copy engine could take them) and its bytes land
// only when something must see them (as late as it could run): the legacy
// stream waiting on an event recorded after it, a synchronize, or cudaFree
// (which synchronises the device). A blocking stream (cudaStreamCreate) is
// also drained before legacy-stream work, as the legacy stream synchronises
// with it; a cudaStreamNonBlocking one is not. Every event has a timestamp.

cudaError_t cudaDeviceSynchronize() {
  land_all();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  auto* stream = new EmuStream;
  stream->blocking = (flags & cudaStreamNonBlocking) == 0;
  streams().insert(stream);
  *s = reinterpret_cast<cudaStream_t>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  auto* stream = reinterpret_cast<EmuStream*>(s);
  land(*stream, stream->issued);  // as CUDA: work already issued completes
  streams().erase(stream);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!s) return cudaSuccess;
  auto* stream = reinterpret_cast<EmuStream*>(s);
  land(*stream, stream->issued);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  const auto* event = reinterpret_cast<EmuEvent*>(e);
  // A created stream waiting on anything: its later copies are deferred
  // anyway, and legacy-stream work is done at issue.
  if (s || !event->stream) return cudaSuccess;
  land(*event->stream, event->issued);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(new EmuEvent);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<EmuEvent*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  auto* event = reinterpret_cast<EmuEvent*>(e);
  event->time = Clock::now();
  event->stream = reinterpret_cast<EmuStream*>(s);
  event->issued = event->stream ? event->stream->issued : 0;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  const auto* event = reinterpret_cast<EmuEvent*>(e);
  if (event->stream) land(*event->stream, event->issued);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  auto d = reinterpret_cast<EmuEvent*>(end)->time - reinterpret_cast<EmuEvent*>(start)->time;
  *ms = std::chrono::duration<float, std::milli>(d).count();
  return cudaSuccess;
}
