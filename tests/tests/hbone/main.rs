//! In-process end-to-end tests of the HBONE data path: two gateways on
//! loopback, real TLS, real HTTP/2, real sockets.

mod admin;
mod authorization;
mod bad_input;
mod cni_del;
mod connection_limits;
mod dial_pacing;
mod drains;
mod integrity;
mod istio_metrics;
mod lifecycle;
mod log_lines;
mod policies;
mod pool;
mod raw_h2;
mod rejections;
mod services;
mod zds;
