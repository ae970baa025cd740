//! bw-console's integration suite: the console against a real stack (`support`), in headless Chromium
//! (`browser`) and page by page for leaks (`leaks`).

mod browser;
mod leaks;
mod support;
