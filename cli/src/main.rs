//! The `walhook` command: see `walhook --help`.

/// mimalloc instead of the system allocator: the hot paths allocate many
/// short-lived buffers (request bodies, headers, batch vectors), and glibc's
/// malloc took about a tenth of the process's CPU in the pipeline benchmark
/// (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    walhook_cli::main()
}
