//! Jacobi2D's CUDA kernels run on the CPU (`emulate.cpp`) and compared with
//! the CPU code they must agree with bit for bit.
//!
//! No GPU is needed: the kernels' source is compiled unchanged as C++ with
//! the few CUDA built-ins they use supplied by the emulator, and launched
//! with the same launch configurations the device path uses. This checks the
//! kernels' indexing, their edge and halo layouts against the host's
//! [`halo_range`]/[`edge_range`], the sweep's order of operations and the
//! residual's warp reduction. It cannot check NVRTC, the driver or the
//! device's arithmetic: `e2e/gpu/run.sh` does, on a GPU.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::{edge_range, edges_config, halo_range, sweep_config, LaunchConfig, SOURCE};
use crate::jacobi::{edge_of, fill_halo, sweep, Side};

const SIDES: [Side; 4] = [Side::North, Side::South, Side::West, Side::East];

/// Block shapes: one point, narrower and wider than a warp, taller than a
/// thread block, exact multiples of both.
const SHAPES: [(usize, usize); 5] = [(1, 1), (37, 13), (64, 16), (5, 40), (100, 3)];

/// The emulator, compiled once per test process into the build directory,
/// beside the test binary (a concurrent run replaces it with the same thing).
fn emulator() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let home = exe.parent().expect("the test binary's directory");
        let dir = home.join(format!("cuda-emulator.{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("emulator directory");
        std::fs::write(dir.join("kernels.inc"), SOURCE).expect("write the kernels");
        let bin = dir.join("emulate");
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let out = Command::new(&cxx)
            .args([
                "-std=c++20",
                "-O1",
                "-ffp-contract=off",
                "-pthread",
                "-Wall",
                "-I",
            ])
            .arg(&dir)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/jacobi_gpu/emulate.cpp"
            ))
            .arg("-o")
            .arg(&bin)
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C++ compiler {cxx:?}: {e}"));
        assert!(
            out.status.success(),
            "the kernels do not compile as C++:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let installed = home.join("cuda-emulator");
        std::fs::rename(&bin, &installed).expect("install the emulator");
        std::fs::remove_dir_all(&dir).expect("remove the build directory");
        installed
    })
}

/// Launches `kernel` on the emulator with `ints` after the launch shape and
/// `input` on its standard input; returns its standard output.
fn launch(kernel: &str, cfg: LaunchConfig, ints: &[usize], input: &[f64]) -> Vec<u8> {
    let (g, b) = (cfg.grid_dim, cfg.block_dim);
    let mut args: Vec<String> = [kernel.to_string()].into();
    args.extend([g.0, g.1, g.2, b.0, b.1, b.2].map(|d| d.to_string()));
    args.extend(ints.iter().map(|i| i.to_string()));
    let mut child = Command::new(emulator())
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the emulator");
    let bytes: Vec<u8> = input.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut stdin = child.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &bytes));
    let out = child.wait_with_output().expect("emulator output");
    writer.join().expect("writer").expect("emulator input");
    assert!(
        out.status.success(),
        "emulate {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Deterministic values of mixed signs and magnitudes, so that any change
/// in the order of the additions changes some result's last bits.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let unit = (s >> 11) as f64 / (1u64 << 53) as f64;
            let scale = [1.0, -3.0e-3, 7.5e5, -1.0][i % 4];
            unit * scale
        })
        .collect()
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn sweep_kernel_matches_the_cpu_sweep_bit_for_bit() {
    for (k, &(w, h)) in SHAPES.iter().enumerate() {
        let cells = (w + 2) * (h + 2);
        let cur = values(cells, k as u64 + 1);
        for want in [true, false] {
            // `next` starts as a copy of `cur` on the device too (its
            // boundary halo is never written).
            let mut cpu_next = cur.clone();
            let cpu_res = sweep(&cur, &mut cpu_next, w, h, want);
            let input: Vec<f64> = cur.iter().chain(&cur).copied().collect();
            let out = launch(
                "jacobi_sweep",
                sweep_config(w, h),
                &[w, h, want as usize],
                &input,
            );
            let (next, res) = out.split_at(cells * 8);
            assert_eq!(bits(&f64s(next)), bits(&cpu_next), "{w}x{h} next");
            let gpu_res = u64::from_le_bytes(res.try_into().expect("one u64"));
            let expect = if want { cpu_res.to_bits() } else { 0 };
            assert_eq!(gpu_res, expect, "{w}x{h} residual");
            assert!(!want || cpu_res > 0.0, "{w}x{h}: a residual to compare");
        }
    }
}

#[test]
fn pack_kernel_gives_every_neighbour_the_cpu_edge() {
    for (k, &(w, h)) in SHAPES.iter().enumerate() {
        let cur = values((w + 2) * (h + 2), 100 + k as u64);
        let edges = f64s(&launch("jacobi_pack", edges_config(w, h), &[w, h], &cur));
        assert_eq!(edges.len(), 2 * w + 2 * h);
        for side in SIDES {
            assert_eq!(
                bits(&edges[edge_range(side, w, h)]),
                bits(&edge_of(&cur, w, h, side)),
                "{w}x{h}: edge for a {side:?} halo"
            );
        }
    }
}

#[test]
fn unpack_kernel_fills_the_halos_the_cpu_fills() {
    for (k, &(w, h)) in SHAPES.iter().enumerate() {
        let cur = values((w + 2) * (h + 2), 200 + k as u64);
        for mask in [0u32, 1, 2, 4, 8, 5, 10, 15] {
            // The host side, as `DeviceGrid::stage_ghost` keeps it.
            let mut halo = vec![0.0; 2 * w + 2 * h];
            let mut cpu = cur.clone();
            for (i, side) in SIDES.into_iter().enumerate() {
                let (range, bit) = halo_range(side, w, h);
                if mask & bit != 0 {
                    let data = values(range.len(), 300 + i as u64);
                    halo[range].copy_from_slice(&data);
                    fill_halo(&mut cpu, w, h, side, &data);
                }
            }
            let input: Vec<f64> = cur.iter().chain(&halo).copied().collect();
            let out = launch(
                "jacobi_unpack",
                edges_config(w, h),
                &[w, h, mask as usize],
                &input,
            );
            assert_eq!(bits(&f64s(&out)), bits(&cpu), "{w}x{h} mask {mask}");
        }
    }
}
