//! bw-console's integration suite: the console against a real stack (`support`), in headless Chromium
//! (`browser`), page by page for leaks (`leaks`), and its shutdown with a live page open (`shutdown`).

mod browser;
mod deploy;
mod holds;
mod leaks;
mod permissions;
mod shutdown;
mod support;
