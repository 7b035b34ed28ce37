// The C entry points of the emulation: launch a kernel by name with cuLaunchKernel-style
// arguments (an array of pointers to the argument values), and list the kernels.
#include "cuda_emu.hpp"

#include <array>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernel_includes.inc"

namespace {

template <class... A, size_t... I>
void call(void (*k)(A...), void** args, std::index_sequence<I...>) {
    k(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}

template <class... A>
void run(void (*k)(A...), dim3 g, dim3 b, size_t smem, void** args) {
    emu::launch(g, b, smem, [&] { call(k, args, std::index_sequence_for<A...>{}); });
}

// One parameter's letter in the launcher's signature (Arg::signature in
// runtime/src/backend/device.rs): p pointer, i int, u unsigned, U unsigned long long, f float;
// '?' for a type the launcher never passes.
template <class T>
constexpr char letter() {
    using U = std::remove_cv_t<std::remove_reference_t<T>>;
    if constexpr (std::is_pointer_v<U>) return 'p';
    else if constexpr (std::is_same_v<U, int>) return 'i';
    else if constexpr (std::is_same_v<U, unsigned>) return 'u';
    else if constexpr (std::is_same_v<U, unsigned long long>) return 'U';
    else if constexpr (std::is_same_v<U, float>) return 'f';
    else return '?';
}

// The kernel's parameter list as letters, NUL-terminated.
template <class... A>
constexpr std::array<char, sizeof...(A) + 1> signature(void (*)(A...)) {
    return {letter<A>()..., '\0'};
}

template <auto K>
constexpr auto kSignature = signature(K);

struct Entry {
    const char* name;
    void (*launch)(dim3, dim3, size_t, void**);
    const char* signature;
};

#define KERNEL(n) \
    {#n, [](dim3 g, dim3 b, size_t s, void** a) { run(&n, g, b, s, a); }, kSignature<&n>.data()},
const Entry table[] = {
#include "kernel_table.inc"
};

}  // namespace

// 0 on success; -1 for an unknown kernel; -2 for a launch shape a GPU refuses (more than 1024
// threads per block, more than 48 KiB of dynamic shared memory without opting in, a grid's y or
// z beyond 65535, an empty grid or block); -3 for parameters whose types (`signature`, one
// letter each) are not the kernel's.
// Whether a GPU accepts the launch shape (the limits above; the fake driver asks it too).
extern "C" bool recipe_emu_shape_ok(const unsigned* grid, const unsigned* block, unsigned smem) {
    unsigned long long threads = 1ull * block[0] * block[1] * block[2];
    return !(threads == 0 || threads > 1024 || block[2] > 64 || smem > 48 * 1024 ||
             grid[1] > 65535 || grid[2] > 65535 || grid[0] == 0 || grid[1] == 0 || grid[2] == 0);
}

// Whether this thread's later launches run their blocks last to first (cuda_emu.hpp,
// `reverse_blocks`).
extern "C" void recipe_emu_block_order(int order) { emu::block_order = order; }

extern "C" int recipe_emu_launch(const char* name, const unsigned* grid, const unsigned* block,
                                 unsigned smem, void** args, const char* signature) {
    if (!recipe_emu_shape_ok(grid, block, smem)) return -2;
    for (const Entry& e : table) {
        if (std::strcmp(e.name, name) == 0) {
            if (std::strcmp(e.signature, signature) != 0) return -3;
            e.launch(dim3(grid[0], grid[1], grid[2]), dim3(block[0], block[1], block[2]), smem, args);
            return 0;
        }
    }
    return -1;
}

extern "C" unsigned recipe_emu_kernel_count() { return sizeof(table) / sizeof(table[0]); }

extern "C" const char* recipe_emu_kernel_name(unsigned i) {
    return i < recipe_emu_kernel_count() ? table[i].name : nullptr;
}

// Kernel `i`'s parameter list as letters (recipe_emu_launch's `signature`).
extern "C" const char* recipe_emu_kernel_signature(unsigned i) {
    return i < recipe_emu_kernel_count() ? table[i].signature : nullptr;
}
