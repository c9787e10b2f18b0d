//! Progress bars of long jobs (archive, reconcile, and the lab's
//! benchmarks, chaos rounds and demo).

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:>24} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    bar
}
