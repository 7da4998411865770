//! The `ductile` command: see [`ductile_operator::cli`] and `docs/cli.md`.

fn main() -> std::process::ExitCode {
    ductile_operator::cli::main()
}
