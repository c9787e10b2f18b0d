//! The `walhook` command: see `walhook --help`.

fn main() -> std::process::ExitCode {
    walhook_cli::main()
}
