//! When and how much to speculate: small, separately tested policies that
//! the draft-verify loop consults between rounds.
//!
//! - [`block_size`]: how many tokens to draft, from recent acceptance;
//! - [`gate`]: DFlash or plain decoding, from measured throughput, with a
//!   calibration per thermal state;
//! - [`thermal`]: the machine's thermal state behind one trait (macOS,
//!   Linux, scripted for tests).

pub mod block_size;
pub mod gate;
pub mod thermal;
