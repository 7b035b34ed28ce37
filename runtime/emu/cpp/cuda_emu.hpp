// The CUDA execution model on the CPU, enough to run runtime/kernels/*.cu unchanged (C++20).
//
// Why this exists: CI has no GPU (docs/cuda.md, "How the kernels are proven").
//
// Both modes below run the blocks of a launch one after another, launches serialised by a mutex,
// so a `__shared__` variable can be a `static`: it is exactly the running block's shared memory.
// Warp shuffles go through per-thread slots and a warp barrier. The two modes differ only
// in what a CUDA thread is, chosen at compile time:
//
// - Fibers (the default: the library runtime/emu links). The CUDA threads of a block are fibers
//   on the launching OS thread, switched by a few instructions of assembly (x86-64 ELF; ucontext
//   elsewhere, or with RECIPE_EMU_UCONTEXT). A cooperative scheduler resumes them in thread order;
//   `__syncthreads`, `__syncwarp` and the shuffles are barriers where a fiber yields until every
//   participant arrived. A barrier costs nanoseconds, where OS threads need every one of up to
//   1024 threads scheduled by the kernel, on 2 cores in CI (figures below).
// - OS threads (RECIPE_EMU_OS_THREADS: tests/tsan.rs builds cpp/tsan_driver.cpp with it, and any
//   -fsanitize=thread build gets it). One OS thread per CUDA thread, the barriers are
//   std::barrier. This is what ThreadSanitizer understands: a missing `__syncthreads` between
//   one thread's shared-memory write and another's read is a data race it reports
//   (tests/tsan.rs). Under fibers TSan would see one thread doing everything in order, and find
//   nothing.
//
// Threads that return early: with fibers, an exited thread is not waited for at its block's later
// `__syncthreads` (what GPUs do in practice); a warp barrier (shuffle, `__syncwarp`) missing an
// exited lane, or threads waiting at barriers that cannot all complete, is reported and aborts
// (a kernel bug; OS threads hang there instead). With OS threads, an exited thread waits at the
// block-end barrier, which is the `__syncthreads` barrier, so it stands in for the first later
// `__syncthreads` only; the block-end barrier then falls out of step (the next block started
// early, or a hang). The shipped kernels return early only where no barrier follows, so both
// modes run them the same.
//
// Wall time on 2 busy cores, OS threads → fibers: the kernel tests of `cargo test --release -p
// recipe-kernel-emu` 48 s → 2 s (the whole command 71 s → 27 s, now mostly tests/tsan.rs building
// its drivers); the emulated training loops of tests/run.rs, fp32 83 s → 3.1 s, fp16 52 s → 2.1 s.
// tests/fibers.rs checks the scheduler itself (cpp/fiber_check.cpp).
#pragma once

#if !defined(RECIPE_EMU_OS_THREADS) && defined(__SANITIZE_THREAD__)  // GCC
#define RECIPE_EMU_OS_THREADS 1
#endif
#if !defined(RECIPE_EMU_OS_THREADS) && defined(__has_feature)  // Clang
#if __has_feature(thread_sanitizer)
#define RECIPE_EMU_OS_THREADS 1
#endif
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

#ifdef RECIPE_EMU_OS_THREADS
#include <barrier>
#include <thread>
#else
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
// The hand-written switch is x86-64 System V assembly in ELF sections; elsewhere ucontext's
// swapcontext, which is slower (a system call for the signal mask at every switch).
#if !defined(__x86_64__) || !defined(__ELF__)
#define RECIPE_EMU_UCONTEXT 1
#endif
#ifdef RECIPE_EMU_UCONTEXT
#include <ucontext.h>
#endif
#endif

#define RECIPE_EMU 1

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3() = default;
    dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {

// The orders a launch's blocks may run in (`block_order`, below).
constexpr int ORDER_FORWARD = 0, ORDER_REVERSED = 1, ORDER_INTERLEAVED = 2;

// What every thread of a launch sees.
struct Launch {
    dim3 grid, block;
    unsigned threads;
    std::vector<unsigned char> dyn_smem;
    // A warp's lanes exchange values through slots: two sets, used in turn (`exchange_slots`).
    std::vector<uint64_t> lanes;  // `shuffle`'s slots, one per thread in each set
    std::vector<unsigned> gathered;  // `warp_exchange`'s slots, 8 words per thread in each set
    std::vector<unsigned char> turn;  // each thread's next set

    int order;                    // the blocks' order (`block_order`)

    Launch(dim3 g, dim3 b, size_t smem, int ord)
        : grid(g),
          block(b),
          threads(b.x * b.y * b.z),
          dyn_smem(smem + 16, 0),
          lanes((size_t)threads * 2, 0),
          gathered((size_t)threads * 16, 0),
          turn(threads, 0),
          order(ord) {}
    unsigned long long blocks() const { return 1ull * grid.x * grid.y * grid.z; }
    // The k-th block to run: x fastest, then y, then z; the other way round when reversed;
    // z fastest, then x, then y when interleaved.
    dim3 block_at(unsigned long long k) const {
        if (order == ORDER_INTERLEAVED)
            return dim3((unsigned)(k / grid.z % grid.x), (unsigned)(k / grid.z / grid.x),
                        (unsigned)(k % grid.z));
        if (order == ORDER_REVERSED) k = blocks() - 1 - k;
        return dim3((unsigned)(k % grid.x), (unsigned)(k / grid.x % grid.y),
                    (unsigned)(k / grid.x / grid.y));
    }
    dim3 thread_index(unsigned t) const {
        return dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
    }
    unsigned warps() const { return (threads + 31) / 32; }
    unsigned warp_lanes(unsigned w) const { return std::min(32u, threads - w * 32); }
};

inline Launch* cur = nullptr;
inline std::mutex launch_mu;
// The order this OS thread's launches run their blocks in: first to last, last to first, or
// the grid's z fastest. A GPU runs blocks in any order, at once; a kernel whose blocks
// communicate (through a counter: common.cuh's `last_of_column`) must give the same bits
// whichever, which the tests check by running it each way (runtime/emu/src/lib.rs,
// `reversed_blocks`, `interleaved_blocks`). Interleaving the z slices (items of one launch,
// each with its own counters and sums) makes them meet where they share what they should not.
inline thread_local int block_order = ORDER_FORWARD;

#ifdef RECIPE_EMU_OS_THREADS

inline thread_local dim3 tid, bid;
inline thread_local unsigned linear = 0;

namespace os {

struct Barriers {
    std::barrier<> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    explicit Barriers(const Launch& l) : block((ptrdiff_t)l.threads) {
        for (unsigned w = 0; w < l.warps(); w++)
            warps.push_back(std::make_unique<std::barrier<>>((ptrdiff_t)l.warp_lanes(w)));
    }
};
inline Barriers* bars = nullptr;

template <class F>
void run(Launch& l, F& body) {
    Barriers b(l);
    bars = &b;
    std::vector<std::thread> pool;
    pool.reserve(l.threads);
    for (unsigned t = 0; t < l.threads; t++) {
        pool.emplace_back([&l, &b, &body, t] {
            linear = t;
            tid = l.thread_index(t);
            for (unsigned long long k = 0; k < l.blocks(); k++) {
                bid = l.block_at(k);
                body();
                // The end of a block: the next block reuses the shared memory.
                b.block.arrive_and_wait();
            }
        });
    }
    for (auto& th : pool) th.join();
    bars = nullptr;
}

}  // namespace os

inline void block_sync() { os::bars->block.arrive_and_wait(); }
inline void warp_sync() { os::bars->warps[linear / 32]->arrive_and_wait(); }

#else  // fibers

// One OS thread runs every fiber, holding launch_mu: the scheduler sets these before resuming one.
inline dim3 tid, bid;
inline unsigned linear = 0;

namespace fiber {

// Where a fiber is suspended. Switching saves the callee-saved registers of the running context
// on its own stack and restores the other's: the compiler sees an ordinary call (which may
// change memory and loses the caller-saved registers), so that is all a switch must keep.
#ifdef RECIPE_EMU_UCONTEXT
struct Context {
    ucontext_t uc;
};
inline void switch_to(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#else
struct Context {
    void* sp = nullptr;
};
extern "C" void recipe_emu_switch(void** save_sp, void* to_sp);
extern "C" void recipe_emu_fiber_start();
// recipe_emu_switch: push the SysV callee-saved registers, MXCSR and the x87 control word, store
// the stack pointer in *save_sp, load to_sp, pop the same. A new fiber's stack holds such a frame
// whose return address is recipe_emu_fiber_start, which calls the function in r12 (never
// returning). A COMDAT group, so every translation unit including this header may emit it.
asm(R"(
    .pushsection .text.recipe_emu_switch,"axG",@progbits,recipe_emu_switch,comdat
    .globl recipe_emu_switch
    .hidden recipe_emu_switch
    .type recipe_emu_switch,@function
    .p2align 4
recipe_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size recipe_emu_switch, .-recipe_emu_switch
    .globl recipe_emu_fiber_start
    .hidden recipe_emu_fiber_start
    .type recipe_emu_fiber_start,@function
recipe_emu_fiber_start:
    callq *%r12
    ud2
    .size recipe_emu_fiber_start, .-recipe_emu_fiber_start
    .popsection
)");
inline void switch_to(Context& from, Context& to) { recipe_emu_switch(&from.sp, to.sp); }
#endif

// A barrier among fibers: the last to arrive opens it (a new generation) and runs on; the others
// are suspended until the scheduler sees the generation move.
struct Barrier {
    unsigned expected = 0, arrived = 0;
    uint64_t gen = 0;
    void reset(unsigned n) {
        expected = n;
        arrived = 0;
    }
    void open() {
        arrived = 0;
        gen++;
    }
};

// A fiber's stack, allocated once and kept for later launches: generous (the memory is only
// reserved; a kernel touches a page or two), with an inaccessible page below it so an overflow
// faults instead of writing into the next stack.
struct Stack {
    static constexpr size_t SIZE = 256 * 1024;
    char* lo = nullptr;  // the usable bottom, above the guard page
    static Stack make() {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        void* p = mmap(nullptr, SIZE + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (p == MAP_FAILED || mprotect(p, page, PROT_NONE) != 0) {
            std::perror("cuda_emu: a fiber stack");
            std::abort();
        }
        return Stack{static_cast<char*>(p) + page};
    }
};

struct Fiber {
    Context ctx;
    dim3 tid;
    Barrier* waiting = nullptr;  // the barrier it is suspended at, if any
    uint64_t gen = 0;            // that barrier's generation when it arrived
    bool done = false;

    bool runnable() const { return !done && (waiting == nullptr || waiting->gen != gen); }
};

// The one scheduler (launch_mu is held while it runs).
struct Scheduler {
    Context main;  // the launching thread, while a block's fibers are not running
    std::vector<Stack> stacks;
    std::vector<Fiber> fibers;
    Barrier block;
    std::vector<Barrier> warps;
    unsigned running = 0;
    unsigned begun = 0;  // the block's threads started so far (they start in thread order)
    unsigned live = 0;   // the block's threads that have not returned
    void (*call)(void*) = nullptr;  // the kernel body
    void* body = nullptr;
};
inline Scheduler sched;

[[noreturn]] inline void deadlock() {
    std::fprintf(stderr,
                 "cuda_emu: block (%u, %u, %u) cannot finish: every thread still running waits at "
                 "a barrier that cannot open (a lane exited before a warp shuffle or __syncwarp, "
                 "or threads wait at different barriers)\n",
                 bid.x, bid.y, bid.z);
    std::abort();
}

[[noreturn]] inline void fiber_main();

// Makes thread t the running one, as the kernel reads it (`threadIdx`).
inline Fiber& make_running(unsigned t) {
    Fiber& f = sched.fibers[t];
    f.waiting = nullptr;
    sched.running = linear = t;
    tid = f.tid;
    return f;
}

// Makes thread t's fiber start at fiber_main on its own stack when switched to.
inline void prepare(unsigned t) {
    Fiber& f = sched.fibers[t];
    const Stack& s = sched.stacks[t];
    sched.begun = t + 1;
#ifdef __SANITIZE_ADDRESS__
    // A fiber that ends switches away inside fiber_main and leave and never returns through
    // them, so AddressSanitizer's poison of those frames' redzones stays on the stack the next
    // fiber reuses; memory there that a later frame uses without ASan marking it afresh read as
    // an overflow (scripts/emu-asan.sh: round_rows' 8 floats, written by ldv once the compiler
    // stopped inlining it). The stack starts clean, as a new thread's does.
    __asan_unpoison_memory_region(s.lo, Stack::SIZE);
#endif
#ifdef RECIPE_EMU_UCONTEXT
    getcontext(&f.ctx.uc);
    f.ctx.uc.uc_stack.ss_sp = s.lo;
    f.ctx.uc.uc_stack.ss_size = Stack::SIZE;
    f.ctx.uc.uc_link = nullptr;
    makecontext(&f.ctx.uc, reinterpret_cast<void (*)()>(&fiber_main), 0);
#else
    // The frame recipe_emu_switch pops, 16 bytes below the top: MXCSR and the x87 control word
    // as the launching thread has them, r15, r14, r13, r12 = fiber_main, rbx, rbp, then the return
    // address. After `ret` the stack pointer is the 16-aligned top, as a call expects.
    uintptr_t top = (reinterpret_cast<uintptr_t>(s.lo) + Stack::SIZE - 16) & ~uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top) - 8;
    uint32_t mxcsr;
    uint16_t fpcw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpcw));
    uint64_t ctl = mxcsr | (uint64_t)fpcw << 32;
    std::memcpy(&sp[0], &ctl, 8);
    for (int r = 1; r < 7; r++) sp[r] = nullptr;
    sp[4] = reinterpret_cast<void*>(&fiber_main);
    sp[7] = reinterpret_cast<void*>(&recipe_emu_fiber_start);
    f.ctx.sp = sp;
#endif
}

// Leaves the running fiber (suspended at a barrier, or returned) for the next runnable one in
// thread order after it, wrapping round: round robin in thread order, each thread run to its next
// barrier or its end. The fibers switch to each other directly, one switch where going through
// the launching thread took two; it is resumed once every thread has returned. A thread not yet
// started is runnable; it starts on its own stack (threads start in order, so it is `begun`).
inline void leave(Context& from) {
    Scheduler& s = sched;
    if (s.live == 0) return switch_to(from, s.main);
    unsigned n = (unsigned)s.fibers.size();
    for (unsigned i = 1, t = s.running; i < n; i++) {
        if (++t == n) t = 0;
        if (t == s.begun) prepare(t);
        else if (!s.fibers[t].runnable()) continue;
        return switch_to(from, make_running(t).ctx);
    }
    deadlock();  // every fiber still running waits at a barrier that cannot open
}

// Suspends the running fiber at `b` unless it is the last to arrive.
inline void arrive_and_wait(Barrier& b) {
    if (++b.arrived == b.expected) return b.open();
    Fiber& f = sched.fibers[sched.running];
    f.waiting = &b;
    f.gen = b.gen;
    leave(f.ctx);
}

// Every fiber starts here: the kernel body for one thread, then on to the next.
//
// When every thread started so far has returned (none waits at a barrier), the next in thread
// order is the first not started, which round robin would switch to next: it runs here instead,
// on this stack, without a switch. So a block whose threads meet no barrier (the elementwise
// kernels) runs on one fiber, its threads one call after another. Once such a thread waits at a
// barrier it is suspended like any other (its context saved as its own; `leave` never switches
// to a thread that has started and not been suspended).
[[noreturn]] inline void fiber_main() {
    Scheduler& s = sched;
    unsigned n = (unsigned)s.fibers.size();
    for (;;) {
        s.call(s.body);
        Fiber& f = s.fibers[s.running];
        f.done = true;
        s.live--;
        // An exited thread is not waited for at later __syncthreads; it may have been the last.
        Barrier& b = s.block;
        if (--b.expected > 0 && b.arrived == b.expected) b.open();
        if (s.begun == n || s.live != n - s.begun) break;
        make_running(s.begun++);
    }
    leave(s.fibers[s.running].ctx);
    std::abort();  // never resumed
}

inline void run(const Launch& l, void (*call)(void*), void* body) {
    Scheduler& s = sched;
    while (s.stacks.size() < l.threads) s.stacks.push_back(Stack::make());
    s.fibers.assign(l.threads, Fiber{});
    for (unsigned t = 0; t < l.threads; t++) s.fibers[t].tid = l.thread_index(t);
    s.warps.assign(l.warps(), Barrier{});
    s.call = call;
    s.body = body;
    for (unsigned long long k = 0; k < l.blocks(); k++) {
        bid = l.block_at(k);
        s.block.reset(l.threads);
        for (unsigned w = 0; w < l.warps(); w++) s.warps[w].reset(l.warp_lanes(w));
        for (Fiber& f : s.fibers) f.done = false;
        // Thread 0 first; the fibers pass control on among themselves (`leave`) and the last
        // to return comes back here.
        s.live = l.threads;
        prepare(0);
        switch_to(s.main, make_running(0).ctx);
    }
}

}  // namespace fiber

inline void block_sync() { fiber::arrive_and_wait(fiber::sched.block); }
inline void warp_sync() { fiber::arrive_and_wait(fiber::sched.warps[linear / 32]); }

#endif

// Runs `body` as a kernel over `grid` × `block` threads with `smem` bytes of dynamic shared memory.
template <class F>
void launch(dim3 grid, dim3 block, size_t smem, F body) {
    std::lock_guard<std::mutex> guard(launch_mu);
    Launch l(grid, block, smem, block_order);
    cur = &l;
#ifdef RECIPE_EMU_OS_THREADS
    os::run(l, body);
#else
    fiber::run(l, [](void* b) { (*static_cast<F*>(b))(); }, &body);
#endif
    cur = nullptr;
}

inline void* dyn_smem() { return cur->dyn_smem.data(); }

// Which set of slots the running lane's exchange (a shuffle or a gather) uses, as an offset in
// threads: the lanes write their values there, meet at one warp barrier, and read each other's.
// Without a second barrier after the reads, a lane's next exchange could overwrite a slot another
// lane has yet to read; so consecutive exchanges alternate between two sets. The exchange after
// next, back in this set, comes after the next exchange's barrier, which every lane reaches only
// once it has read this one's slots (the same order for std::barrier, so ThreadSanitizer sees it).
// A warp's lanes make the same exchanges, so they agree on the set. One barrier an exchange halves
// the fibers' switches in shuffle-heavy kernels (the reductions).
inline size_t exchange_slots() {
    unsigned char& t = cur->turn[linear];
    size_t set = t;
    t ^= 1;
    return set * cur->threads;
}

// Every lane's `n` words of `mine` (n ≤ GATHER_WORDS), for a whole warp: how the emulated
// mma.sync (common.cuh, `mma_16816`) reads the fragments the other lanes hold. One warp barrier,
// where the same exchange through shuffles would take one per word and lane. Returns the warp's
// slots, lane l's words at [l · GATHER_WORDS …]: read them before this lane's next exchange (the
// one after it writes the other set, `exchange_slots`), so each lane reads only the words it
// needs instead of copying the warp's.
constexpr unsigned GATHER_WORDS = 8;
inline const unsigned* warp_exchange(const unsigned* mine, unsigned n) {
    unsigned me = linear, warp = me / 32;
    if (cur->warp_lanes(warp) != 32 || n > GATHER_WORDS) {
        std::fprintf(stderr, "cuda_emu: warp_exchange needs a whole warp (warp %u has %u lanes)\n",
                     warp, cur->warp_lanes(warp));
        std::abort();
    }
    unsigned* slots = cur->gathered.data() + exchange_slots() * GATHER_WORDS;
    for (unsigned i = 0; i < n; i++) slots[me * GATHER_WORDS + i] = mine[i];
    warp_sync();  // every lane's words are in
    return slots + warp * 32 * GATHER_WORDS;
}

template <class T>
T shuffle(unsigned mask, T v, unsigned src_lane_xor, bool is_xor, unsigned src_abs) {
    static_assert(sizeof(T) <= 8);
    unsigned me = linear, warp = me / 32;
    // A mask naming lanes the warp does not have (a block that is not whole warps) is
    // undefined behaviour on a GPU, where a lane here would read what it holds: refused.
    unsigned lanes = cur->warp_lanes(warp);
    unsigned present = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    if (mask & ~present) {
        std::fprintf(stderr,
                     "cuda_emu: a shuffle with mask %#x in warp %u, which has %u lanes (a block "
                     "of %u threads): undefined on a GPU\n",
                     mask, warp, lanes, cur->threads);
        std::abort();
    }
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    uint64_t* slots = cur->lanes.data() + exchange_slots();
    slots[me] = bits;
    warp_sync();  // every lane's value is in
    unsigned lane = me & 31;
    unsigned src = warp * 32 + (is_xor ? (lane ^ src_lane_xor) : src_abs);
    T out = v;
    if (src < cur->threads) std::memcpy(&out, &slots[src], sizeof(T));
    return out;
}

// A load or store of `bytes` (4, 8 or 16) at p, which a GPU makes one access only if p is a
// multiple of it: a misaligned one stops the kernel there ("misaligned address", and the
// context with it), where the CPU would read the bytes anyway. Refused here as there, so
// that a kernel's choice of its vectorised path is checked on the CPU (common.cuh, `ld16`).
inline void check_aligned(const void* p, unsigned bytes, const char* what) {
    if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
        std::fprintf(stderr, "cuda_emu: %s of %u bytes at %p, not %u-byte aligned: a misaligned "
                     "address on a GPU\n", what, bytes, p, bytes);
        std::abort();
    }
}
}  // namespace emu

#define threadIdx (emu::tid)
#define blockIdx (emu::bid)
#define blockDim (emu::cur->block)
#define gridDim (emu::cur->grid)
#define warpSize 32

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// A register budget for ptxas; nothing to the emulation.
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
#define DYN_SHARED(T, name) T* name = static_cast<T*>(emu::dyn_smem())

inline void __syncthreads() { emu::block_sync(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_sync(); }

template <class T>
T __shfl_xor_sync(unsigned m, T v, int mask) { return emu::shuffle(m, v, (unsigned)mask, true, 0); }
template <class T>
T __shfl_sync(unsigned m, T v, int lane) {
    return emu::shuffle(m, v, 0, false, (unsigned)lane & 31);
}
template <class T>
T __shfl_down_sync(unsigned m, T v, unsigned d) {
    unsigned lane = emu::linear & 31;
    return emu::shuffle(m, v, 0, false, lane + d < 32 ? lane + d : lane);
}

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
// Blocks run one after another here, so every write is seen by the blocks after it.
inline void __threadfence() {}
using std::max;
using std::min;

inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned atomicMin(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}
inline unsigned atomicExch(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).exchange(v); }
inline int atomicOr(int* p, int v) { return std::atomic_ref<int>(*p).fetch_or(v); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_or(v); }
