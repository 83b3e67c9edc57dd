//! The Python extension (work in progress).
