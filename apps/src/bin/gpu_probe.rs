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

/// The command line (`gpu_probe --help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "gpu_probe",
    about = "A GPU's copy bandwidths and first-context time as one JSON line, or (--emit-ptx) the programs' GPU modules as shipped PTX"
)]
struct Cli {
    /// Bytes per copy.
    #[arg(long, value_name = "N", default_value_t = 1 << 30)]
    bytes: usize,
    /// Copies per direction (the median is reported).
    #[arg(long, value_name = "R", default_value_t = 10, value_parser = ductile_apps::args::at_least_one::<usize>)]
    reps: usize,
    /// CUDA device ordinal.
    #[arg(long, value_name = "D", default_value_t = 0)]
    device: usize,
    /// Compile every GPU module with NVRTC and write DIR/<module>.ptx instead (no driver or device needed).
    #[arg(long = "emit-ptx", value_name = "DIR", conflicts_with_all = ["bytes", "reps", "device"])]
    emit_ptx: Option<std::path::PathBuf>,
    /// Compute capability to compile for with --emit-ptx (e.g. 9.0).
    #[arg(long, value_name = "MAJOR.MINOR", requires = "emit_ptx", value_parser = compute_capability)]
    cc: Option<(i32, i32)>,
}

fn compute_capability(text: &str) -> Result<(i32, i32), String> {
    text.split_once('.')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .ok_or_else(|| format!("`{text}` is not MAJOR.MINOR, e.g. 9.0"))
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("gpu_probe: {e}");
    std::process::exit(2)
}

fn main() {
    let cli = <Cli as clap::Parser>::parse();
    if let Some(dir) = &cli.emit_ptx {
        emit_ptx(dir, cli.cc);
        return;
    }
    let (bytes, reps, device) = (cli.bytes, cli.reps, cli.device);
    #[cfg(feature = "cuda")]
    match ductile::gpu::probe_bandwidth(device, bytes, reps) {
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
