// `sqlx::migrate!` and `include_str!` embed sql/ at compile time: rebuild when a
// file is added or changed.
fn main() {
    println!("cargo:rerun-if-changed=sql");
}
