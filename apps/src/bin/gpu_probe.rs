//! `gpu_probe [--bytes N] [--reps R] [--device D]`: the copy bandwidths of a
//! GPU (host to device and back through pinned memory, device to device)
//! and how long its first context took, as one JSON line. `e2e/gpu/run.sh`
//! sets Jacobi2D's GPU throughput against these. Exits 2, with a message,
//! where there is no GPU.
//!
//! `gpu_probe --emit-ptx DIR [--cc MAJOR.MINOR]`: compiles every GPU module
//! of these programs with NVRTC, as a node would at start, and writes them
//! as shipped PTX (`DIR/<module>.ptx`, for `DUCTILE_GPU_PTX_DIR` on a GPU
//! machine without NVRTC). Needs NVRTC only, no driver or device.

use ductile_apps::args;

const USAGE: &str = "usage: gpu_probe [--bytes N] [--reps R] [--device D]\n       gpu_probe --emit-ptx DIR [--cc MAJOR.MINOR]";

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("gpu_probe: {e}");
    std::process::exit(2)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if let Some(dir) = args::value(&argv, "emit-ptx") {
        let cc = args::value(&argv, "cc").map(|t| {
            let (major, minor) = t
                .split_once('.')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .unwrap_or_else(|| {
                    fail(format!("--cc {t}: expected MAJOR.MINOR, e.g. 9.0\n{USAGE}"))
                });
            (major, minor)
        });
        emit_ptx(std::path::Path::new(dir), cc);
        return;
    }
    let parsed = (|| -> Result<(usize, usize, usize), String> {
        Ok((
            args::parse(&argv, "bytes", 1usize << 30)?,
            args::parse(&argv, "reps", 10usize)?,
            args::parse(&argv, "device", 0usize)?,
        ))
    })();
    let (bytes, reps, device) = parsed.unwrap_or_else(|e| fail(format!("{e}\n{USAGE}")));
    #[cfg(feature = "cuda")]
    match ductile::gpu::probe_bandwidth(device, bytes, reps.max(1)) {
        Ok(b) => println!(
            "{}",
            serde_json::to_string(&b).expect("a bandwidth record serialises")
        ),
        Err(e) => fail(e),
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (bytes, reps, device);
        fail("built without the `cuda` feature")
    }
}

#[cfg(feature = "cuda")]
fn emit_ptx(dir: &std::path::Path, cc: Option<(i32, i32)>) {
    use ductile::gpu::{compile_ptx, write_shipped_ptx};
    std::fs::create_dir_all(dir).unwrap_or_else(|e| fail(format!("{}: {e}", dir.display())));
    for module in ductile_apps::gpu_modules() {
        let ptx = compile_ptx(&module, cc).unwrap_or_else(|e| fail(e));
        let path = write_shipped_ptx(dir, &module, &ptx)
            .unwrap_or_else(|e| fail(format!("{}: {e}", dir.display())));
        println!("{} {} bytes", path.display(), ptx.len());
    }
}

#[cfg(not(feature = "cuda"))]
fn emit_ptx(_: &std::path::Path, _: Option<(i32, i32)>) {
    fail("built without the `cuda` feature")
}
