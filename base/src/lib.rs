//! The leaves every tidegate crate shares, each importing nothing of the
//! others:
//! - [`sync`]: the one lock convention (a poisoned lock is taken as it is);
//! - [`shutdown`]: the process's shutdown signal and its deadline;
//! - [`descriptors`]: open descriptors against the open-file limit, and
//!   errors that come from a full descriptor table;
//! - [`fd_passing`]: descriptors received with a message (`SCM_RIGHTS`),
//!   as a node agent hands a pod's network namespace over;
//! - [`logging`]: the binaries' log output (`TIDEGATE_LOG`);
//! - [`range`]: a number's accepted range and the error naming its key;
//! - [`duration`] and [`size`]: durations (`250ms`, `5m`) and byte sizes
//!   (`64KiB`) as the configuration, the admin API and the command lines
//!   write them.

#![forbid(unsafe_code)]

pub mod descriptors;
pub mod duration;
pub mod fd_passing;
pub mod logging;
pub mod range;
pub mod shutdown;
pub mod size;
pub mod sync;
