//! What the command lines of `sliver-torture` and `sliver-load` share. Each binary includes
//! this file as a module of its own (`#[path]`): it is no part of the library.

// How the report is given (the last options of each command line). A plain comment: a doc
// comment here would become the command's description wherever the parent sets none.
#[derive(clap::Args)]
pub struct Report {
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `seed`, or one from the clock when none was given.
pub fn seed_or_clock(seed: Option<u64>) -> u64 {
    seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    })
}
