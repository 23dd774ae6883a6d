//! Stand-alone `reclaim` for trying the crate before `sliver reclaim` is wired up:
//! `cargo run -p sliver-reclaim --example reclaim -- --help`.

use clap::Parser;

#[derive(Parser)]
#[command(name = "reclaim")]
struct Cli {
    #[command(flatten)]
    args: sliver_reclaim::ReclaimArgs,
}

fn main() -> std::process::ExitCode {
    match sliver_reclaim::run(Cli::parse().args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sliver reclaim: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
