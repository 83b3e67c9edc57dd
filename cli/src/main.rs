//! `gendurable`: migrate, inspect, demo and benchmark the engine (see the
//! `gendurable_cli` library, which the Python package runs too).

fn main() {
    std::process::exit(gendurable_cli::run(std::env::args_os()));
}
