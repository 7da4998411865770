//! The `ductile-coordinator` binary: see [`ductile_coordinator::cli`].

fn main() {
    std::process::exit(ductile_coordinator::cli::main_with_args(std::env::args_os()));
}
