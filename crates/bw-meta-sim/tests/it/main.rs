//! Simulator tests.
