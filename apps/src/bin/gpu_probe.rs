//! `gpu_probe [--bytes N] [--reps R] [--device D]`: the copy bandwidths of a
//! GPU (host to device and back through pinned memory, device to device)
//! and how long its first context took, as one JSON line. `e2e/gpu/run.sh`
//! sets Jacobi2D's GPU throughput against these. Exits 2, with a message,
//! where there is no GPU.

use ductile_apps::args;

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let parsed = (|| -> Result<(usize, usize, usize), String> {
        Ok((
            args::parse(&argv, "bytes", 1usize << 30)?,
            args::parse(&argv, "reps", 10usize)?,
            args::parse(&argv, "device", 0usize)?,
        ))
    })();
    let (bytes, reps, device) = parsed.unwrap_or_else(|e| {
        eprintln!("gpu_probe: {e}\nusage: gpu_probe [--bytes N] [--reps R] [--device D]");
        std::process::exit(2)
    });
    #[cfg(feature = "cuda")]
    match ductile::gpu::probe_bandwidth(device, bytes, reps.max(1)) {
        Ok(b) => println!(
            "{}",
            serde_json::to_string(&b).expect("a bandwidth record serialises")
        ),
        Err(e) => {
            eprintln!("gpu_probe: {e}");
            std::process::exit(2)
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (bytes, reps, device);
        eprintln!("gpu_probe: built without the `cuda` feature");
        std::process::exit(2)
    }
}
