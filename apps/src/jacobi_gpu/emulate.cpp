// Runs Jacobi2D's CUDA kernels on the CPU, for the unit tests in emulated.rs.
//
// The kernels' source is included unchanged (kernels.inc, written by the
// test). This file supplies what CUDA's compiler would: the thread indices,
// the correctly rounded double operations (plain IEEE operations here; the
// test compiles with -ffp-contract=off so nothing is fused), warp shuffles
// and atomics. Each warp's threads run as real OS threads, so a shuffle
// synchronises its 32 lanes as a device would; blocks and warps run one after
// another.
//
// usage: emulate KERNEL GX GY GZ BX BY BZ INT... < f64 inputs > outputs
//   jacobi_sweep  W H WANT_RESIDUAL  in: cur, next   out: next, residual (u64)
//   jacobi_pack   W H                in: cur         out: edges
//   jacobi_unpack W H MASK           in: cur, halo   out: cur
// All values little-endian, as the host writes them.

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

struct uint3 {
    unsigned x, y, z;
};

static thread_local uint3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__

static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }

static inline long long __double_as_longlong(double v) {
    long long bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bits;
}

[[noreturn]] static void fail(const char* what) {
    std::fprintf(stderr, "emulate: %s\n", what);
    std::exit(2);
}

// The warp a thread belongs to, and its lane in it.
struct Warp {
    std::barrier<>* barrier;
    unsigned long long slots[32];
    unsigned size;
};
static thread_local Warp* this_warp;
static thread_local unsigned lane;

template <class T>
static T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    static_assert(sizeof(T) <= sizeof(unsigned long long));
    if (mask != 0xffffffffu || this_warp->size != 32) {
        fail("a full-mask shuffle in a partial warp");
    }
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    this_warp->slots[lane] = bits;
    this_warp->barrier->arrive_and_wait();
    bits = this_warp->slots[lane ^ static_cast<unsigned>(lane_mask)];
    this_warp->barrier->arrive_and_wait();
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

static unsigned long long atomicMax(unsigned long long* at, unsigned long long v) {
    std::atomic_ref<unsigned long long> a(*at);
    unsigned long long old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

#include "kernels.inc"

// Runs `body` once per thread of a launch of `grid` blocks of `block` threads.
static void launch(uint3 grid, uint3 block, const std::function<void()>& body) {
    unsigned n = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx)
                for (unsigned first = 0; first < n; first += 32) {
                    unsigned size = n - first < 32 ? n - first : 32;
                    std::barrier<> barrier(size);
                    Warp warp{&barrier, {}, size};
                    std::vector<std::jthread> lanes;
                    for (unsigned l = 0; l < size; ++l) {
                        lanes.emplace_back([&, l] {
                            unsigned t = first + l;
                            threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                            blockIdx = {bx, by, bz};
                            blockDim = block;
                            gridDim = grid;
                            this_warp = &warp;
                            lane = l;
                            body();
                        });
                    }
                }
}

template <class T>
static std::vector<T> read(size_t n) {
    std::vector<T> v(n);
    if (n && std::fread(v.data(), sizeof(T), n, stdin) != n) fail("short input");
    return v;
}

template <class T>
static void write(const std::vector<T>& v) {
    if (!v.empty() && std::fwrite(v.data(), sizeof(T), v.size(), stdout) != v.size()) fail("short write");
}

int main(int argc, char** argv) {
    if (argc < 10) fail("usage: emulate KERNEL GX GY GZ BX BY BZ W H [INT]");
    std::string kernel = argv[1];
    auto arg = [&](int i) { return static_cast<unsigned>(std::strtoul(argv[i], nullptr, 10)); };
    uint3 grid{arg(2), arg(3), arg(4)}, block{arg(5), arg(6), arg(7)};
    int w = static_cast<int>(arg(8)), h = static_cast<int>(arg(9));
    size_t cells = size_t(w + 2) * size_t(h + 2), edges = size_t(2 * w + 2 * h);
    if (kernel == "jacobi_sweep" && argc == 11) {
        int want = static_cast<int>(arg(10));
        auto cur = read<double>(cells), next = read<double>(cells);
        std::vector<unsigned long long> residual{0};
        launch(grid, block, [&] { jacobi_sweep(cur.data(), next.data(), w, h, residual.data(), want); });
        write(next);
        write(residual);
    } else if (kernel == "jacobi_pack" && argc == 10) {
        auto cur = read<double>(cells);
        std::vector<double> out(edges, 0.0);
        launch(grid, block, [&] { jacobi_pack(cur.data(), out.data(), w, h); });
        write(out);
    } else if (kernel == "jacobi_unpack" && argc == 11) {
        int mask = static_cast<int>(arg(10));
        auto cur = read<double>(cells), halo = read<double>(edges);
        launch(grid, block, [&] { jacobi_unpack(cur.data(), halo.data(), w, h, mask); });
        write(cur);
    } else {
        fail("unknown kernel or wrong argument count");
    }
    return 0;
}
