//! The Elixir NIF (work in progress).
